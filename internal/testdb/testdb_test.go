package testdb_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m))
}

func TestNewIsolatesSchemas(t *testing.T) {
	t.Parallel()
	a, b := testdb.New(t), testdb.New(t)
	var sa, sb string
	if err := a.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&sa); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&sb); err != nil {
		t.Fatal(err)
	}
	if sa == sb || !strings.HasPrefix(sa, "idem_test_") || !strings.HasPrefix(sb, "idem_test_") {
		t.Fatalf("schemas %q and %q, want two distinct idem_test_ schemas", sa, sb)
	}
	if _, err := a.Exec(t.Context(), `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, locked_until, expires_at)
		VALUES ('k', 'e', 'h', now(), now())`); err != nil {
		t.Fatalf("migrated table: %v", err)
	}
	var n int
	if err := b.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the other schema sees %d rows (err %v), want 0", n, err)
	}
}

func TestNewDSN(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var schema string
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT current_schema(), (SELECT count(*) FROM idempotency_keys)`).Scan(&schema, &n); err != nil {
		t.Fatalf("DSN's schema has no migrated table: %v", err)
	}
	if !strings.HasPrefix(schema, "idem_test_") {
		t.Fatalf("DSN's current schema = %q, want an idem_test_ schema", schema)
	}
}
