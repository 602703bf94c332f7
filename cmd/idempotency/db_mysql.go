package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// database is what the commands use: the
// PostgreSQL pool and its store, or, for a MySQL/MariaDB URL, sqlstore's
// store on a *sql.DB.
type database struct {
	pool  *pgxpool.Pool // PostgreSQL
	sqlDB *sql.DB       // MySQL/MariaDB
	store idempotency.Store
}

// Close closes the pool.
func (d *database) Close() {
	if d.pool != nil {
		d.pool.Close()
	}
	if d.sqlDB != nil {
		_ = d.sqlDB.Close()
	}
}

// sealStats reads sealStatsSQL, which both dialects run as it is.
func (d *database) sealStats(ctx context.Context) (map[string]int64, error) {
	if d.pool != nil {
		return sealStats(ctx, d.pool)
	}
	rows, err := d.sqlDB.QueryContext(ctx, sealStatsSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			id string
			n  int64
		)
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// isMySQLURL reports a database URL for sqlstore's MySQL dialect: the
// mysql:// scheme, or a go-sql-driver DSN (user@tcp(host:port)/db), as the
// example server reads DATABASE_URL.
func isMySQLURL(u string) bool {
	return strings.HasPrefix(u, "mysql://") || strings.Contains(u, "@tcp(") || strings.HasPrefix(u, "tcp(")
}

// databaseURL returns --database-url, else DATABASE_URL; neither is a
// usage error.
func (c *cli) databaseURL() (string, error) {
	url := c.g.databaseURL.v
	if !c.g.databaseURL.set {
		url = c.getenv(envDatabaseURL)
	}
	if strings.TrimSpace(url) == "" {
		return "", usagef("no database: set --database-url or %s (e.g. postgres://user@host:5432/db or mysql://user@host:3306/db)", envDatabaseURL)
	}
	return url, nil
}

// openDB opens the database of the URL for a command that reads or
// changes keys, checked as openChecked does (sqlstore's Check on MySQL).
func (c *cli) openDB(ctx context.Context) (*database, error) {
	url, err := c.databaseURL()
	if err != nil {
		return nil, err
	}
	if !isMySQLURL(url) {
		pool, err := c.openChecked(ctx)
		if err != nil {
			return nil, err
		}
		return &database{pool: pool, store: idempotency.NewPostgresStore(pool)}, nil
	}
	db, err := c.openMySQL(ctx, url, false)
	if err != nil {
		return nil, err
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	s, err := sqlstore.New(sctx, db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err == nil {
		err = s.Check(sctx)
	}
	if err != nil {
		_ = db.Close()
		if errors.Is(err, idempotency.ErrSchemaOutdated) || errors.Is(err, sqlstore.ErrNotBinary) {
			return nil, err
		}
		return nil, c.dbError(ctx, "check the table", err)
	}
	return &database{sqlDB: db, store: s}, nil
}

// mysqlConfig parses a mysql:// URL or a go-sql-driver DSN, with times
// parsed and the dial timeout set when the URL names none. A malformed URL
// is a usage error whose text never holds the password.
func mysqlConfig(url string) (*mysql.Config, error) {
	dsn, err := sqlstore.MySQLDSN(url)
	if err != nil {
		return nil, usagef("invalid database URL: not a valid mysql:// URL")
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, usagef("invalid database URL: %s", strings.TrimPrefix(err.Error(), "invalid DSN: "))
	}
	if cfg.DBName == "" {
		return nil, usagef("invalid database URL: it names no database (mysql://user@host:3306/db)")
	}
	cfg.ParseTime = true
	if cfg.Timeout == 0 {
		cfg.Timeout = connectTimeout
	}
	return cfg, nil
}

// openMySQL opens a small pool on url (multiStatements for the migration
// connection only) and checks that the server answers.
func (c *cli) openMySQL(ctx context.Context, url string, multiStatements bool) (*sql.DB, error) {
	cfg, err := mysqlConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MultiStatements = multiStatements
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(4) // one does the work; Check's probe and migrate borrow another
	pctx, cancel := context.WithTimeout(ctx, 2*cfg.Timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		if ctx.Err() != nil {
			return nil, errors.New("interrupted while connecting")
		}
		return nil, fmt.Errorf("cannot reach the database: %s", connectDetail(err))
	}
	c.mysql = true
	return db, nil
}

// mysqlMessage is a MySQL error's number and message.
func mysqlMessage(err error) (string, bool) {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Sprintf("%s (error %d)", me.Message, me.Number), true
	}
	return "", false
}
