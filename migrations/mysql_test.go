package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
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
// status check kept), where bodies 000001's JSON_VALID checks refused are
// stored; one step down is version 1's column types again (text, without
// the checks that were the defect) and up is version 2 again. Every row
// keeps its bytes through all three.
func TestMySQLMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	d := mysqldb.NewEmpty(t)
	db := d.Open(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), migrateTimeout)
	defer cancel()
	if err := migrations.MigrateMySQL(ctx, d.DSN); err != nil {
		t.Fatalf("MigrateMySQL: %v", err)
	}
	m := migrator(t, d.DSN)
	wantVersion(t, m, 2)
	wantColumns(t, db, d.Name, "longblob")
	rows := map[string][2]string{
		"plain":     {`{"order":"AAPL","qty":1}`, `{"Location":["/orders/1"]}`},
		"deep":      {strings.Repeat("[", 40) + strings.Repeat("]", 40), `{}`},
		"surrogate": {`{"note":"\ud800"}`, `{"X":["\udc00"]}`},
	}
	for key, r := range rows {
		mustExec(t, db, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, status, response_code,
	response_body, response_headers, created_at, locked_at, locked_until, expires_at)
VALUES (?, 'POST /orders', REPEAT('0', 64), 'completed', 201, ?, ?,
	UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)`, key, r[0], r[1])
	}
	wantStatusCheck(t, db, "version 2")
	wantRows(t, db, "version 2", rows)
	wantDeriveKeyID(t, db, d.Name, "varchar NO ''")

	wantRetain(t, db, d.Name, true)

	step(t, m, -1)
	wantVersion(t, m, 1)
	wantRetain(t, db, d.Name, false)
	wantColumns(t, db, d.Name, "longtext")
	wantStatusCheck(t, db, "version 1")
	wantRows(t, db, "version 1", rows)
	wantDeriveKeyID(t, db, d.Name, "")

	step(t, m, +1)
	wantVersion(t, m, 2)
	wantColumns(t, db, d.Name, "longblob")
	wantStatusCheck(t, db, "version 2 again")
	wantRows(t, db, "version 2 again", rows)
	wantDeriveKeyID(t, db, d.Name, "varchar NO ''")
	wantRetain(t, db, d.Name, true)
	var backfilled int
	if err := db.QueryRowContext(bounded(t), `SELECT COUNT(*) FROM idempotency_keys WHERE retain_until = expires_at`).Scan(&backfilled); err != nil || backfilled != len(rows) {
		t.Fatalf("rows with retain_until = expires_at after up: %d (%v), want all %d backfilled", backfilled, err, len(rows))
	}
}

// wantRetain checks round 4's retain_until (issue #36): DATETIME(6) NOT
// NULL under idx_idem_keys_retain when present, else neither.
func wantRetain(t *testing.T, db *sql.DB, schema string, present bool) {
	t.Helper()
	var typ, nullable string
	var precision sql.NullInt64
	err := db.QueryRowContext(bounded(t), `SELECT data_type, is_nullable, datetime_precision FROM information_schema.columns
WHERE table_schema = ? AND table_name = 'idempotency_keys' AND column_name = 'retain_until'`, schema).Scan(&typ, &nullable, &precision)
	switch {
	case !present && errors.Is(err, sql.ErrNoRows):
	case !present:
		t.Fatalf("retain_until after down: %s (%v), want no column", typ, err)
	case err != nil || typ != "datetime" || nullable != "NO" || precision.Int64 != 6:
		t.Fatalf("retain_until: %s nullable %s precision %v (%v), want datetime(6) NOT NULL", typ, nullable, precision, err)
	}
	var n int
	if err := db.QueryRowContext(bounded(t), `SELECT COUNT(*) FROM information_schema.statistics
WHERE table_schema = ? AND table_name = 'idempotency_keys' AND index_name = 'idx_idem_keys_retain' AND column_name = 'retain_until'`, schema).Scan(&n); err != nil || (n == 1) != present {
		t.Fatalf("idx_idem_keys_retain on retain_until: %d (%v), want present %v", n, err, present)
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

// wantDeriveKeyID checks derive_key_id's type, nullability and default
// ("type NULLABLE default"), or its absence (want "").
func wantDeriveKeyID(t *testing.T, db *sql.DB, schema, want string) {
	t.Helper()
	var got string
	err := db.QueryRowContext(bounded(t), `SELECT CONCAT(data_type, ' ', is_nullable, ' ', COALESCE(column_default, 'none')) FROM information_schema.columns
WHERE table_schema = ? AND table_name = 'idempotency_keys' AND column_name = 'derive_key_id'`, schema).Scan(&got)
	if err == sql.ErrNoRows {
		got = ""
	} else if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("derive_key_id: %q, want %q (000002_round4 adds it NOT NULL DEFAULT '')", got, want)
	}
}

// wantStatusCheck: the status check of 000001 holds.
func wantStatusCheck(t *testing.T, db *sql.DB, schema string) {
	t.Helper()
	if _, err := db.ExecContext(bounded(t), `UPDATE idempotency_keys SET status = 'bogus'`); err == nil {
		t.Fatalf("%s took status 'bogus': its status check is gone", schema)
	}
}

// wantRows checks each row's body and headers, byte for byte.
func wantRows(t *testing.T, db *sql.DB, schema string, rows map[string][2]string) {
	t.Helper()
	for key, want := range rows {
		var b, h []byte
		if err := db.QueryRowContext(bounded(t), `SELECT response_body, response_headers FROM idempotency_keys WHERE idem_key = ?`, key).Scan(&b, &h); err != nil {
			t.Fatalf("%s, row %s: %v", schema, key, err)
		}
		if !bytes.Equal(b, []byte(want[0])) || !bytes.Equal(h, []byte(want[1])) {
			t.Fatalf("%s, row %s: body %q headers %q, want %q and %q", schema, key, b, h, want[0], want[1])
		}
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
