package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/migrations"
	"github.com/idemkit/idempotency/sqlstore"
)

// TestMySQLCheck: a migrated table passes; a missing table, text key
// columns under a _ci collation, a unique key the server made USING HASH,
// and a role without DELETE are each refused with their own error.
func TestMySQLCheck(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	if err := d.store(t, 2).Check(t.Context()); err != nil {
		t.Fatalf("Check on the migrated table: %v", err)
	}
	db := d.open(t, 2)

	missing, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: "nope"})
	if err != nil {
		t.Fatal(err)
	}
	if r := idempotencytest.StoreReason(t, "Check of a missing table", missing.Check(t.Context())); r != idempotency.ReasonSchema {
		t.Fatalf("missing table: reason %s, want schema", r)
	}

	exec(t, db, `CREATE TABLE ci_keys LIKE idempotency_keys`,
		`ALTER TABLE ci_keys MODIFY idem_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL`)
	ci, _ := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: "ci_keys"})
	if err := ci.Check(t.Context()); !errors.Is(err, sqlstore.ErrNotBinary) {
		t.Fatalf("Check of text key columns: %v, want ErrNotBinary", err)
	}

	exec(t, db, `CREATE TABLE hash_keys LIKE idempotency_keys`,
		`ALTER TABLE hash_keys DROP INDEX uq_idem_key_user_endpoint`,
		`ALTER TABLE hash_keys ADD CONSTRAINT uq_idem_key_user_endpoint UNIQUE KEY (idem_key, scope_user_id, scope_endpoint) USING HASH`)
	hashed, _ := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: "hash_keys"})
	if err := hashed.Check(t.Context()); !errors.Is(err, sqlstore.ErrNotBinary) {
		t.Fatalf("Check of a USING HASH unique key: %v, want ErrNotBinary", err)
	}

	user := "idem_" + d.name[len("idem_test_"):]
	exec(t, db, "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'pw'", "GRANT SELECT, INSERT, UPDATE ON "+d.name+".* TO '"+user+"'@'%'")
	t.Cleanup(func() { exec(t, d.open(t, 1), "DROP USER IF EXISTS '"+user+"'@'%'") })
	cfg, _ := mysql.ParseDSN(d.dsn)
	cfg.User, cfg.Passwd = user, "pw"
	limited, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	ls, err := sqlstore.New(t.Context(), limited, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	err = ls.Check(t.Context())
	if r := idempotencytest.StoreReason(t, "Check without DELETE", err); r != idempotency.ReasonPermission || !strings.Contains(err.Error(), "DELETE") {
		t.Fatalf("Check without DELETE: %v (reason %s), want permission naming DELETE", err, r)
	}
}

// TestMySQLErrorClasses: the MySQL column of the class table, from real
// failures: a wrong password and an unknown database are auth, a closed
// pool is closed, a pool whose every connection is in use is
// pool_exhausted (the database was never asked), a value the column cannot
// hold is data.
func TestMySQLErrorClasses(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	cfg, _ := mysql.ParseDSN(d.dsn)
	claim := func(dsn string, mod func(*sql.DB)) error {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		s, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Schema: d.name})
		if err != nil {
			return err
		}
		if mod != nil {
			mod(db)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err = s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
		return err
	}
	reasonOf := func(err error) string {
		var se *idempotency.StoreError
		if errors.As(err, &se) {
			return se.Reason
		}
		return "not a StoreError: " + err.Error()
	}
	bad := cfg.Clone()
	bad.Passwd = "wrong"
	if r := reasonOf(claim(bad.FormatDSN(), nil)); r != idempotency.ReasonAuth {
		t.Errorf("wrong password: %s, want auth", r)
	}
	nodb := cfg.Clone()
	nodb.DBName = "no_such_database_here"
	if r := reasonOf(claim(nodb.FormatDSN(), nil)); r != idempotency.ReasonAuth {
		t.Errorf("unknown database: %s, want auth", r)
	}
	if r := reasonOf(claim(d.dsn, func(db *sql.DB) { _ = db.Close() })); r != idempotency.ReasonClosed {
		t.Errorf("closed pool: %s, want closed", r)
	}
	var held *sql.Conn
	if r := reasonOf(claim(d.dsn, func(db *sql.DB) {
		db.SetMaxOpenConns(1)
		var err error
		if held, err = db.Conn(t.Context()); err != nil {
			t.Fatal(err)
		}
	})); r != idempotency.ReasonPoolExhausted {
		t.Errorf("every connection in use: %s, want pool_exhausted", r)
	}
	_ = held.Close()

	s := d.store(t, 2)
	req := idempotencytest.Request("u", time.Hour, time.Minute)
	req.Scope = strings.Repeat("s", 1025)
	if _, err := s.Claim(t.Context(), req); reasonOf(err) != idempotency.ReasonData {
		t.Errorf("a scope over the column: %v, want data", err)
	}
}

// TestMySQLCheckRefusesVersion1: a table made by migration 000001 alone
// (bodies and headers as text under JSON_VALID checks, which refuse JSON
// 32 levels deep and lone surrogate escapes) is refused, naming the
// migration that fixes it; so is a table whose body columns are bytes but
// still under a JSON check (what migration 000002_round4 drops by name on
// MySQL 8.0).
func TestMySQLCheckRefusesVersion1(t *testing.T) {
	t.Parallel()
	v1 := mysqldb.NewEmpty(t)
	up, err := fs.ReadFile(migrations.MySQLFS, "000001_create_idempotency_keys.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	exec(t, v1.Open(t, 1), string(up))
	s, err := sqlstore.New(t.Context(), v1.Open(t, 2), sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(t.Context())
	if !errors.Is(err, idempotency.ErrSchemaOutdated) || !strings.Contains(err.Error(), "000002_round4") {
		t.Fatalf("Check of a version-1 table: %v, want ErrSchemaOutdated naming 000002_round4", err)
	}

	d := newMySQLDB(t)
	db := d.open(t, 2)
	exec(t, db, `CREATE TABLE checked_keys LIKE idempotency_keys`,
		`ALTER TABLE checked_keys ADD CONSTRAINT checked_keys_chk_1 CHECK (response_body IS NULL OR JSON_VALID(response_body))`)
	checked, _ := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: "checked_keys"})
	err = checked.Check(t.Context())
	if !errors.Is(err, idempotency.ErrSchemaOutdated) || !strings.Contains(err.Error(), "checked_keys_chk_1") {
		t.Fatalf("Check of byte columns under a JSON check: %v, want ErrSchemaOutdated naming checked_keys_chk_1", err)
	}
}
