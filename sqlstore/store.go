package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/probe"
)

// Dialect is the SQL dialect of the database behind the *sql.DB.
type Dialect string

const (
	// MySQL is MySQL 8.0 and MariaDB 10.11 (go-sql-driver/mysql). CI tests
	// MariaDB; on MySQL 8.0 the statements are kept to the common subset,
	// untested.
	MySQL Dialect = "mysql"
	// PostgreSQL is PostgreSQL through a database/sql driver (pgx's stdlib
	// or lib/pq), on the pgx store's table.
	PostgreSQL Dialect = "postgres"
)

// Config configures New.
type Config struct {
	// Dialect is the database's SQL dialect. Required.
	Dialect Dialect
	// Table is the table's name, unqualified. Defaults to idempotency_keys.
	Table string
	// Schema is the database (MySQL) or schema (PostgreSQL) that holds the
	// table; every statement names the table qualified by it. Defaults to
	// the connection's current database (DATABASE()) or schema
	// (current_schema()) when New runs.
	Schema string
	// Logger receives the store's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// Store is an idempotency.TxStore on a *sql.DB; it is safe for
// concurrent use. The *sql.DB stays the caller's.
type Store struct {
	db      *sql.DB
	d       dialect
	st      statements
	table   string // qualified
	mariadb bool
	log     *slog.Logger
	probes  probe.Gate // one outage probe at a time (Probe)
}

// The dialects' columns of the class table and their codes.
var (
	pgDialect    = dialect{name: PostgreSQL, codeReason: pgReason, duplicate: []string{"23505"}, restart: []string{"40001", "40P01"}}
	mysqlDialect = dialect{name: MySQL, codeReason: mysqlReason, duplicate: []string{"1062"}, restart: []string{"1213"}}
)

// statements are a dialect's statements for one qualified table.
type statements struct {
	insert, readKey, readID, takeover, complete, fail, release, releaseOwner string
	cleanup, purge, now, eraseDelete, eraseKept, export                      string
	savepoint, rollbackSavepoint, endLease, renew                            string
	reconcileClaim, stale                                                    string // reconcile.go
	txInsert                                                                 string // PostgreSQL: a transactional claim's INSERT
	cleanupPlans                                                             string // PostgreSQL: set first in cleanup's transaction
}

// dialect is what differs between the databases beyond the statements.
type dialect struct {
	name       Dialect
	codeReason func(string) string
	duplicate  []string // the codes of a duplicate key
	restart    []string // the codes that restart a claim (deadlock, serialization)
}

// New returns a Store on db for cfg.Dialect. It reads the current database
// or schema (unless cfg.Schema names it) and the server's flavour, so it
// talks to the database once, under ctx. It does not check the table:
// call Check at start-up for that. On MySQL it logs a WARN through
// cfg.Logger when the pool's DSN (sql.Open's, or mysql.NewConnector's
// Config) names no dial timeout (timeout=5s).
func New(ctx context.Context, db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: New: db is nil")
	}
	s := &Store{db: db, log: cmp.Or(cfg.Logger, slog.Default())}
	table := cmp.Or(cfg.Table, "idempotency_keys")
	switch cfg.Dialect {
	case MySQL:
		s.d = mysqlDialect
		var version string
		var current sql.NullString
		if err := db.QueryRowContext(ctx, "SELECT VERSION(), DATABASE()").Scan(&version, &current); err != nil {
			return nil, fmt.Errorf("sqlstore: New: %w", s.storeError("check", err))
		}
		schema := cmp.Or(cfg.Schema, current.String)
		if schema == "" {
			return nil, errors.New("sqlstore: New: the connection has no current database: name one in the DSN or in Config.Schema")
		}
		if set, known := dialTimeout(db); known && !set {
			s.log.WarnContext(ctx, "sqlstore: the MySQL DSN has no dial timeout: a connect into a black-holed network waits for the "+
				"operating system's TCP timeout (minutes) and holds a pool slot long after the request gave up; add timeout=5s to the DSN")
		}
		s.mariadb = strings.Contains(strings.ToLower(version), "mariadb")
		s.table = mysqlQuote(schema) + "." + mysqlQuote(table)
		s.st = mysqlStatements(s.table)
	case PostgreSQL:
		return newPostgres(ctx, s, db, cfg, table)
	default:
		return nil, fmt.Errorf("sqlstore: New: Config.Dialect must be sqlstore.MySQL or sqlstore.PostgreSQL, got %q", cfg.Dialect)
	}
	return s, nil
}

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.d.name }

// DB returns the *sql.DB the store was built on.
func (s *Store) DB() *sql.DB { return s.db }

// conn takes a connection from the pool under ctx. A wait that ran out is
// pool_exhausted whatever the pool's state:
// every connection in use is saturation, and a connect still under way is
// no evidence of an outage either (the outage probe decides that).
func (s *Store) conn(ctx context.Context) (*sql.Conn, error) {
	c, err := s.db.Conn(ctx)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		st := s.db.Stats()
		return nil, &acquireError{reason: idempotency.ReasonPoolExhausted,
			err: fmt.Errorf("%w (%d of %d in use)", err, st.InUse, st.MaxOpenConnections)}
	}
	return nil, err
}

// withConn runs f on a connection taken explicitly (conn), given back
// after. It returns by ctx's deadline whatever the driver does (bounded):
// a call lib/pq cannot stop on a link that answers nothing is left to
// finish on its own, and its connection is closed when it does.
func (s *Store) withConn(ctx context.Context, f func(c *sql.Conn) error) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	_, err = bounded(ctx, func() (struct{}, error) { return struct{}{}, f(c) }, func(struct{}, error) {
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
		_ = c.Close()
	})
	if !errors.Is(err, errLost) {
		_ = c.Close()
	}
	return err
}
