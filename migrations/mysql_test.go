package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/migrations"
)

// migrateTimeout bounds each migration step of these tests.
const migrateTimeout = 30 * time.Second

// TestMySQLMigrateUpDownUp: on MariaDB, MigrateMySQL brings an empty
// database to version 2 (bodies and headers LONGBLOB with no check, the
// status check kept); one step down is version 1 again (text under
// JSON_VALID checks) and up is version 2 again, and a recorded response
// keeps its bytes through all three. At version 2 a body JSON_VALID refuses
// is stored; at version 1 it is refused.
func TestMySQLMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	d := mysqldb.NewEmpty(t)
	db := d.Open(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 4*migrateTimeout)
	defer cancel()
	if err := migrations.MigrateMySQL(ctx, d.DSN); err != nil {
		t.Fatalf("MigrateMySQL: %v", err)
	}
	m := migrator(t, d.DSN)
	wantVersion(t, m, 2)
	wantColumns(t, db, d.Name, "longblob")
	body, headers := `{"order":"AAPL","qty":1}`, `{"Location":["/orders/1"]}`
	mustExec(t, db, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, status, response_code,
	response_body, response_headers, created_at, locked_at, locked_until, expires_at)
VALUES ('k', 'POST /orders', REPEAT('0', 64), 'completed', 201, ?, ?,
	UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)`, body, headers)
	if _, err := db.ExecContext(bounded(t), `UPDATE idempotency_keys SET status = 'bogus'`); err == nil {
		t.Fatal("version 2 took status 'bogus': its status check is gone")
	}
	wantStored(t, db, "version 2", true)

	step(t, m, -1)
	wantVersion(t, m, 1)
	wantColumns(t, db, d.Name, "longtext")
	wantStored(t, db, "version 1", false)
	wantRow(t, db, body, headers)

	step(t, m, +1)
	wantVersion(t, m, 2)
	wantColumns(t, db, d.Name, "longblob")
	wantStored(t, db, "version 2 again", true)
	wantRow(t, db, body, headers)
}

// TestMySQLMigrateDownRefusesBodiesVersion1CannotHold: one step down is
// refused while a row holds JSON that version 1's check refuses, and the
// row and the columns stay as they were.
func TestMySQLMigrateDownRefusesBodiesVersion1CannotHold(t *testing.T) {
	t.Parallel()
	d := mysqldb.New(t)
	db := d.Open(t, 2)
	deep := strings.Repeat("[", 40) + strings.Repeat("]", 40)
	mustExec(t, db, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, status, response_code,
	response_body, created_at, locked_at, locked_until, expires_at)
VALUES ('deep', 'POST /orders', REPEAT('0', 64), 'completed', 201, ?,
	UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)`, deep)
	m := migrator(t, d.DSN)
	if err := runBounded(t, func() error { return m.Steps(-1) }); err == nil {
		t.Fatal("down to version 1 with a body 40 levels deep: succeeded, want refused")
	}
	wantColumns(t, db, d.Name, "longblob")
	var got []byte
	if err := db.QueryRowContext(bounded(t), `SELECT response_body FROM idempotency_keys WHERE idem_key = 'deep'`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if string(got) != deep {
		t.Fatalf("the row's body after the refused down: %q, want %q", got, deep)
	}
}

// migrator opens golang-migrate on MySQLFS for dsn, as MigrateMySQL does,
// closed when the test ends.
func migrator(t *testing.T, dsn string) *migrate.Migrate {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), migrateTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	driver, err := migratemysql.WithConnection(ctx, conn, &migratemysql.Config{
		MigrationsTable: "idempotency_schema_migrations", DatabaseName: cfg.DBName})
	if err != nil {
		t.Fatal(err)
	}
	src, err := iofs.New(migrations.MySQLFS, ".")
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "mysql", driver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

// runBounded runs a golang-migrate call, which takes no context, and fails
// the test by name if it has not returned within migrateTimeout.
func runBounded(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(migrateTimeout):
		t.Fatalf("a migration step did not return within %v", migrateTimeout)
		return nil
	}
}

// step migrates n steps (negative: down).
func step(t *testing.T, m *migrate.Migrate, n int) {
	t.Helper()
	if err := runBounded(t, func() error { return m.Steps(n) }); err != nil {
		t.Fatalf("migrate %+d: %v", n, err)
	}
}

func wantVersion(t *testing.T, m *migrate.Migrate, want uint) {
	t.Helper()
	v, dirty, err := m.Version()
	if err != nil || v != want || dirty {
		t.Fatalf("version %d (dirty %v, %v), want %d", v, dirty, err, want)
	}
}

// wantColumns checks the JSON body's and the headers' column type.
func wantColumns(t *testing.T, db *sql.DB, schema, want string) {
	t.Helper()
	for _, c := range []string{"response_body", "response_headers"} {
		var typ string
		if err := db.QueryRowContext(bounded(t), `SELECT data_type FROM information_schema.columns
WHERE table_schema = ? AND table_name = 'idempotency_keys' AND column_name = ?`, schema, c).Scan(&typ); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if typ != want {
			t.Fatalf("%s is %s, want %s", c, typ, want)
		}
	}
}

// wantStored records, on a row of its own, a JSON body 40 levels deep and
// one with a lone surrogate escape (valid JSON text that MariaDB's
// JSON_VALID refuses), and headers that JSON_VALID refuses too; stored says
// whether the schema must take them.
func wantStored(t *testing.T, db *sql.DB, schema string, stored bool) {
	t.Helper()
	for i, body := range []string{strings.Repeat("[", 40) + strings.Repeat("]", 40), `{"note":"\ud800"}`} {
		key := "probe-" + string(rune('a'+i))
		_, err := db.ExecContext(bounded(t), `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, status, response_code,
	response_body, response_headers, created_at, locked_at, locked_until, expires_at)
VALUES (?, 'POST /orders', REPEAT('0', 64), 'completed', 201, ?, ?,
	UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)`, key, body, `{"X":["\udc00"]}`)
		if (err == nil) != stored {
			t.Fatalf("%s, body %q: insert error %v, want stored %v", schema, body, err, stored)
		}
		if stored {
			var got []byte
			if err := db.QueryRowContext(bounded(t), `SELECT response_body FROM idempotency_keys WHERE idem_key = ?`, key).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if string(got) != body {
				t.Fatalf("%s: stored %q, read %q", schema, body, got)
			}
			mustExec(t, db, `DELETE FROM idempotency_keys WHERE idem_key = ?`, key)
		}
	}
}

// wantRow checks row k's body and headers, byte for byte.
func wantRow(t *testing.T, db *sql.DB, body, headers string) {
	t.Helper()
	var b, h []byte
	if err := db.QueryRowContext(bounded(t), `SELECT response_body, response_headers FROM idempotency_keys WHERE idem_key = 'k'`).Scan(&b, &h); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, []byte(body)) || !bytes.Equal(h, []byte(headers)) {
		t.Fatalf("row k: body %q headers %q, want %q and %q", b, h, body, headers)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(bounded(t), q, args...); err != nil {
		t.Fatalf("%s: %v", strings.SplitN(q, "\n", 2)[0], err)
	}
}

// bounded is a context for one statement of a test: a statement that has
// no answer within migrateTimeout fails with context.DeadlineExceeded.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), migrateTimeout)
	t.Cleanup(cancel)
	return ctx
}
