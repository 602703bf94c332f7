package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/testdb"
)

// testRole creates a role (CREATE ROLE name attrs), runs each grant
// statement with %s replaced by its name and %[2]s by the test's schema,
// and drops the role when the test ends. It fails the test when roles
// cannot be created under IDEMPOTENCY_REQUIRE_DB=1, and skips it otherwise.
func testRole(t *testing.T, pool *pgxpool.Pool, attrs string, grants ...string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	role := "idem_test_role_" + hex.EncodeToString(b[:])
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	stmts := append([]string{"CREATE ROLE " + role + " " + attrs}, grants...)
	for i, s := range stmts {
		if i > 0 {
			s = strings.NewReplacer("%s", role, "%[2]s", schema).Replace(s)
		}
		if _, err := pool.Exec(t.Context(), s); err != nil {
			if i == 0 && os.Getenv(testdb.EnvRequire) != "1" {
				t.Skipf("cannot create a role: %v", err)
			}
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		// Runs after the role's pools are closed (cleanups run last first).
		if _, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	return role
}

// rolePool opens a pool like pool's (same schema) that logs in as role,
// closed when the test ends.
func rolePool(t *testing.T, pool *pgxpool.Pool, role string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// grantAll is every privilege the store needs, for testRole.
var grantAll = []string{
	`GRANT USAGE ON SCHEMA %[2]s TO %s`,
	`GRANT SELECT, INSERT, UPDATE, DELETE ON %[2]s.idempotency_keys TO %s`,
	`GRANT USAGE ON SEQUENCE %[2]s.idempotency_keys_id_seq TO %s`,
}

// newLogBuffer returns a JSON logger at every level and its output.
func newLogBuffer() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
