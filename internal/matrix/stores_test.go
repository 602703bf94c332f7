//go:build matrix

package matrix

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the sql-pgx store's driver, and the direct connections'
	_ "github.com/lib/pq"              // the sql-pq store's driver

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/sqlstore"
)

// storeEnv is one cell's store: its own schema (PostgreSQL) or database
// (MariaDB), reached through a TCP proxy the faults cut, and a direct
// connection, past the proxy, for the ledger and the faults' own sessions.
type storeEnv struct {
	kind   storeKind
	store  idempotency.Store // sealed when the column is
	proxy  *tcpproxy.Proxy   // between the store and the database; nil on memory
	direct *sql.DB           // straight to the cell's schema or database; nil on memory
	// dsn is the store's connection string (through the proxy), in the
	// driver's own form, for faults that open connections of their own.
	dsn string
	// directDSN is the database's connection string past the proxy, for
	// the kill -9 cells' children.
	directDSN string
	// The store's own pool, for the pool faults: one of the two.
	pgPool  *pgxpool.Pool
	sqlPool *sql.DB
	max     int // the pool's size
}

// storeOpts sizes a cell's store.
type storeOpts struct {
	maxConns int // the store's pool; default 4, so 4 cells stay under max_connections
	// batchSlots > 0: the pgx store batches with that many slots
	// (PostgresStore.SetBatching), so that concurrent calls queue.
	batchSlots int
}

// ledgerDDL creates the tables the handlers write: the ledger (one row per
// committed execution on transactional routes) and two accounts for the
// deadlock fault.
var ledgerDDL = []string{
	"CREATE TABLE matrix_ledger (k VARCHAR(255) NOT NULL, note VARCHAR(64) NOT NULL DEFAULT '')",
	"CREATE TABLE matrix_acc (id INT PRIMARY KEY, bal INT NOT NULL)",
	"INSERT INTO matrix_acc VALUES (1, 1000), (2, 1000)",
}

// newStore builds the column's store for t.
func newStore(t *testing.T, c column, o storeOpts) *storeEnv {
	t.Helper()
	if o.maxConns == 0 {
		o.maxConns = 4
	}
	var se *storeEnv
	switch c.store {
	case storeMemory:
		se = &storeEnv{kind: c.store, store: idempotency.NewMemoryStore()}
	case storeMySQL:
		se = newMySQLStore(t, o)
	default:
		se = newPGStore(t, c.store, o)
	}
	se.max = o.maxConns
	if se.direct != nil {
		for _, s := range ledgerDDL {
			if _, err := se.direct.ExecContext(t.Context(), s); err != nil {
				t.Fatalf("ledger: %s: %v", s, err)
			}
		}
	}
	if c.v.sealed {
		sealed, err := idempotency.NewSealingStore(t.Context(), se.store, sealKeys())
		if err != nil {
			t.Fatalf("NewSealingStore: %v", err)
		}
		se.store = sealed
	}
	return se
}

// newPGStore builds a pgx, sql-pgx or sql-pq store on a new schema.
func newPGStore(t *testing.T, kind storeKind, o storeOpts) *storeEnv {
	t.Helper()
	dsn := testdb.NewDSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, u.Host)
	pu := *u
	pu.Host = proxy.Addr()
	q := pu.Query()
	q.Set("connect_timeout", "2")
	pu.RawQuery = q.Encode()
	se := &storeEnv{kind: kind, proxy: proxy, direct: openSQL(t, "pgx", dsn, 4), dsn: pu.String(), directDSN: dsn}
	switch kind {
	case storePgx:
		cfg, err := pgxpool.ParseConfig(se.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = int32(o.maxConns)
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		ps := idempotency.NewPostgresStore(pool)
		if o.batchSlots > 0 {
			ps.SetBatching(32, o.batchSlots)
		}
		warm(t, o.maxConns, func(ctx context.Context) (func(), error) {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return c.Release, nil
		})
		t.Cleanup(ps.Close) // its wait listener, before the pool
		se.store, se.pgPool = ps, pool
	case storeSQLPgx, storeSQLPq:
		driver := map[storeKind]string{storeSQLPgx: "pgx", storeSQLPq: "postgres"}[kind]
		se.sqlPool = openSQL(t, driver, se.dsn, o.maxConns)
		se.store = newSQLStore(t, se.sqlPool, sqlstore.PostgreSQL)
	}
	return se
}

// newMySQLStore builds a sqlstore on a new MariaDB database.
func newMySQLStore(t *testing.T, o storeOpts) *storeEnv {
	t.Helper()
	d := mysqldb.New(t)
	cfg, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, cfg.Addr)
	cfg.Addr = proxy.Addr()
	cfg.Timeout = 2 * time.Second
	se := &storeEnv{kind: storeMySQL, proxy: proxy, direct: openSQL(t, "mysql", d.DSN, 4), dsn: cfg.FormatDSN(), directDSN: d.DSN}
	se.sqlPool = openSQL(t, "mysql", se.dsn, o.maxConns)
	se.store = newSQLStore(t, se.sqlPool, sqlstore.MySQL)
	return se
}

// newSQLStore builds a sqlstore on db.
func newSQLStore(t *testing.T, db *sql.DB, d sqlstore.Dialect) idempotency.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: d, Logger: quiet})
	if err != nil {
		t.Fatalf("sqlstore.New(%s): %v", d, err)
	}
	return s
}

// openSQL opens a pool of at most n connections, closed when the test ends.
func openSQL(t *testing.T, driver, dsn string, n int) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	t.Cleanup(func() { _ = db.Close() })
	warm(t, n, func(ctx context.Context) (func(), error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		return func() { _ = c.Close() }, nil
	})
	return db
}

// warm opens a cell's n connections before it runs, as a serving process
// has them: on a machine where a PostgreSQL backend takes 20 ms or more to
// start (measured with pgbench -C on a CI machine), a cold pool's burst of
// connects, several cells at once, outlasts the cells' store timeout. The
// faults that want a cold pool empty it themselves (emptyPool). open holds
// one connection until its release is called.
func warm(t *testing.T, n int, open func(context.Context) (release func(), err error)) {
	t.Helper()
	releases := make([]func(), 0, n)
	for range n {
		release, err := open(t.Context())
		if err != nil {
			t.Fatalf("warm the pool: %v", err)
		}
		releases = append(releases, release)
	}
	for _, release := range releases {
		release()
	}
}

// sealKeyText is one active sealing key, the same for every cell and the
// kill -9 cells' children (MATRIX_SEAL_KEYS).
var sealKeyText = sync.OnceValue(func() string {
	if s := os.Getenv(envSealKeys); s != "" {
		return s
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return "m1:" + base64.StdEncoding.EncodeToString(k)
})

// sealKeys parses sealKeyText.
var sealKeys = sync.OnceValue(func() idempotency.SealKeys {
	keys, err := idempotency.ParseSealKeys(sealKeyText())
	if err != nil {
		panic(err)
	}
	return keys
})

// q adapts a statement written with $n placeholders to the store's dialect.
func (se *storeEnv) q(s string) string {
	if se.kind != storeMySQL {
		return s
	}
	for _, n := range []string{"$1", "$2", "$3"} {
		s = strings.ReplaceAll(s, n, "?")
	}
	return s
}

// expiresAt reads key's expires_at from its row (the only scope the
// entries use is the empty one).
func (se *storeEnv) expiresAt(ctx context.Context, key string) (time.Time, error) {
	var at time.Time
	if se.direct == nil { // memory: its rows are the store's own
		recs, err := se.store.ExportScope(ctx, "")
		for _, r := range recs {
			if r.Key == key {
				at = r.ExpiresAt
			}
		}
		return at, err
	}
	err := se.direct.QueryRowContext(ctx, se.q("SELECT expires_at FROM idempotency_keys WHERE idem_key = $1"), key).Scan(&at)
	return at, err
}

// ledgerRows counts the committed effects of key: its ledger rows but
// those a handler wrote after its transaction ended (note 'after').
func (se *storeEnv) ledgerRows(ctx context.Context, key string) (int, error) {
	var n int
	err := se.direct.QueryRowContext(ctx, se.q("SELECT count(*) FROM matrix_ledger WHERE k = $1 AND note = ''"), key).Scan(&n)
	return n, err
}
