package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/migrations"
	"github.com/idemkit/idempotency/sqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// setupTimeout bounds a test database's creation and migration.
const setupTimeout = 30 * time.Second

// mysqlDB is one test's MariaDB database: migrated, dropped when the
// test ends.
type mysqlDB struct {
	dsn  string // go-sql-driver DSN of the database
	name string
}

// newMySQLDB creates a database of its own for t on the server of
// IDEMPOTENCY_TEST_MYSQL_URL (skipping without it) and migrates it.
func newMySQLDB(t testing.TB) mysqlDB {
	t.Helper()
	base, err := sqlstore.MySQLDSN(testdb.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	admin(t, cfg, "CREATE DATABASE "+name)
	t.Cleanup(func() { admin(t, cfg, "DROP DATABASE IF EXISTS "+name) })
	cfg.DBName = name
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	dsn := cfg.FormatDSN()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.MigrateMySQL(ctx, dsn); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return mysqlDB{dsn: dsn, name: name}
}

// admin runs one statement on a connection of its own.
func admin(t testing.TB, cfg *mysql.Config, stmt string) {
	t.Helper()
	c := cfg.Clone()
	c.DBName = ""
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// open opens a pool on d, closed when the test ends.
func (d mysqlDB) open(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// store returns a Store on a pool of its own on d.
func (d mysqlDB) store(t testing.TB, maxConns int) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(t.Context(), d.open(t, maxConns), sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// exec runs statements on db.
func exec(t testing.TB, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", strings.SplitN(s, "\n", 2)[0], err)
		}
	}
}
