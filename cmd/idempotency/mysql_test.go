package main

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/sqlstore"
)

// newMySQLTestDB is newTestDB on MariaDB/MySQL (IDEMPOTENCY_TEST_MYSQL_URL;
// skipped without it): a database of its own, migrated, whose dsn is a
// mysql:// URL, the form DATABASE_URL takes.
func newMySQLTestDB(t *testing.T) testDB {
	t.Helper()
	return mysqlTestDB(t, mysqldb.New(t))
}

// mysqlTestDB is the testDB of d.
func mysqlTestDB(t *testing.T, d mysqldb.DB) testDB {
	t.Helper()
	u, err := url.Parse(testdb.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + d.Name
	db := d.Open(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	return testDB{dsn: u.String(), sqlDB: db, store: s}
}

// eachDialect runs f as a subtest on a fresh PostgreSQL schema and on a
// fresh MariaDB database, so a command's assertions hold on both.
func eachDialect(t *testing.T, f func(t *testing.T, db testDB)) {
	t.Helper()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, newTestDB(t))
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		f(t, newMySQLTestDB(t))
	})
}

var pgParam = regexp.MustCompile(`\$[0-9]+`)

// mysqlWhere turns a test's PostgreSQL condition into MySQL's: the
// database's clock in UTC (the columns' time zone) and ? parameters.
func mysqlWhere(q string) string {
	return pgParam.ReplaceAllString(strings.ReplaceAll(q, "now()", "UTC_TIMESTAMP(6)"), "?")
}

// tableExists reports whether idempotency_keys exists in db's schema.
func (db testDB) tableExists(t *testing.T) bool {
	t.Helper()
	var exists bool
	var err error
	if db.sqlDB != nil {
		err = db.sqlDB.QueryRowContext(t.Context(), `SELECT COUNT(*) > 0 FROM information_schema.tables
			WHERE table_schema = DATABASE() AND table_name = 'idempotency_keys'`).Scan(&exists)
	} else {
		err = db.pool.QueryRow(t.Context(), `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&exists)
	}
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

// TestMySQLEmptyDatabase: on a MariaDB database without the table, a
// command that reads keys says to migrate (exit 1); migrate up creates it
// from no version, and the command then works.
func TestMySQLEmptyDatabase(t *testing.T) {
	t.Parallel()
	db := mysqlTestDB(t, mysqldb.NewEmpty(t))
	r := runDB(t, db.dsn, "stats")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "table idempotency_keys not found in the URL's database: run `idempotency migrate up`") {
		t.Errorf("stats without the table: %q", r.stderr)
	}
	r = runDB(t, db.dsn, "migrate", "version")
	wantCode(t, r, exitOK)
	if r.stdout != "none\n" {
		t.Errorf("version of an empty database printed %q, want none", r.stdout)
	}
	r = runDB(t, db.dsn, "migrate", "up")
	wantCode(t, r, exitOK)
	if r.stdout != "migrated up: version none -> 2\n" {
		t.Errorf("up printed %q", r.stdout)
	}
	if !db.tableExists(t) {
		t.Fatal("no idempotency_keys after migrate up")
	}
	r = runDB(t, db.dsn, "stats", "--json")
	wantCode(t, r, exitOK)
}

// TestMySQLURLs: a go-sql-driver DSN selects MySQL as a mysql:// URL does;
// a malformed URL is a usage error and an unreachable server a failure,
// neither printing the password.
func TestMySQLURLs(t *testing.T) {
	t.Parallel()
	db := newMySQLTestDB(t)
	u, err := url.Parse(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	dsn := u.User.String() + "@tcp(" + u.Host + ")" + u.Path
	r := runDB(t, dsn, "stats")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "keys                          0") {
		t.Errorf("stats over a driver DSN:\n%s", r.stdout)
	}

	const pw = "s3cr3t-pw"
	for _, c := range []struct {
		url  string
		code int
		want string
	}{
		{"mysql://root:" + pw + "@127.0.0.1:1/x", exitFailure, "cannot reach the database"},
		{"mysql://root:" + pw + "@127.0.0.1:3306", exitUsage, "it names no database"},
		{"mysql://root:" + pw + "@[::1/x", exitUsage, "invalid database URL"},
	} {
		r := runDB(t, c.url, "stats")
		wantCode(t, r, c.code)
		if !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr+r.stdout, pw) {
			t.Errorf("stats on %s: %q, want %q and no password", c.url, r.stderr, c.want)
		}
	}
}
