// Package mysqldb gives each test a MySQL/MariaDB database of its own on
// the server of IDEMPOTENCY_TEST_MYSQL_URL, migrated with
// migrations.MigrateMySQL and dropped when the test ends (skipping, or
// failing with IDEMPOTENCY_REQUIRE_MYSQL=1, as internal/testdb does without
// the variable). It imports go-sql-driver/mysql, which is why it is a
// package of its own: testdb's users need no MySQL driver.
package mysqldb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/migrations"
	"github.com/idemkit/idempotency/sqlstore"
)

// setupTimeout bounds a database's creation and migration.
const setupTimeout = 30 * time.Second

// DB is one test's database.
type DB struct {
	DSN  string // go-sql-driver DSN of the database, parseTime=true, a dial timeout
	Name string // the database's name
}

// New creates a migrated database for tb.
func New(tb testing.TB) DB {
	tb.Helper()
	d := NewEmpty(tb)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.MigrateMySQL(ctx, d.DSN); err != nil {
		tb.Fatalf("mysqldb: migrate: %v", err)
	}
	return d
}

// NewEmpty creates an empty database for tb.
func NewEmpty(tb testing.TB) DB {
	tb.Helper()
	base, err := sqlstore.MySQLDSN(testdb.MySQLURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		tb.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	Admin(tb, cfg, "CREATE DATABASE "+name)
	tb.Cleanup(func() { Admin(tb, cfg, "DROP DATABASE IF EXISTS "+name) })
	cfg.DBName = name
	cfg.ParseTime = true
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	return DB{DSN: cfg.FormatDSN(), Name: name}
}

// Admin runs one statement on a connection of its own to cfg's server.
func Admin(tb testing.TB, cfg *mysql.Config, stmt string) {
	tb.Helper()
	c := cfg.Clone()
	c.DBName = ""
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		tb.Fatalf("mysqldb: %s: %v", stmt, err)
	}
}

// Open opens a pool of at most maxConns connections on d, closed when the
// test ends.
func (d DB) Open(tb testing.TB, maxConns int) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", d.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}
