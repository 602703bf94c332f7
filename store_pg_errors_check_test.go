package idempotency_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresCheck: Check passes the migrated table, and names what an
// old or damaged one lacks: a column (an edited 000001 keeps version 1, so
// migrating never adds it), the unique constraint the claim's ON CONFLICT
// needs, or the table itself.
func TestPostgresCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, ddl, want string
	}{
		{"migrated", "", ""},
		{"no owner_token", `ALTER TABLE idempotency_keys DROP COLUMN owner_token`, "lacks column owner_token"},
		{"no seal_key_id", `ALTER TABLE idempotency_keys DROP COLUMN seal_key_id`, "lacks column seal_key_id"},
		{"no unique constraint", `ALTER TABLE idempotency_keys DROP CONSTRAINT uq_idem_key_user_endpoint`, "lacks constraint uq_idem_key_user_endpoint"},
		{"no table", `DROP TABLE idempotency_keys`, "no idempotency_keys table"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			if c.ddl != "" {
				if _, err := pool.Exec(t.Context(), c.ddl); err != nil {
					t.Fatal(err)
				}
			}
			err := idempotency.NewPostgresStore(pool).Check(t.Context())
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Check: %v, want nil", err)
			case c.want == "":
				return
			case err == nil || !strings.Contains(err.Error(), c.want):
				t.Fatalf("Check: %v, want an error saying %q", err, c.want)
			case c.name == "no table" && !errors.Is(err, idempotency.ErrStoreUnavailable):
				t.Errorf("Check without a table: %v, want a *StoreError", err)
			case c.name != "no table" && !errors.Is(err, idempotency.ErrSchemaOutdated):
				t.Errorf("Check: %v, want ErrSchemaOutdated", err)
			}
		})
	}
}

// TestPostgresCheckPrivileges: Check runs a rolled-back probe (insert, which
// takes the id sequence, then read, update, delete) as the pool's role, so
// a role that lacks any privilege the store needs fails it, and the error
// names the privilege; a role with all of them passes, and the probe
// leaves no row.
func TestPostgresCheckPrivileges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, revoke, want string
	}{
		{"all granted", "", ""},
		{"no USAGE on the sequence", `REVOKE USAGE ON SEQUENCE %[2]s.idempotency_keys_id_seq FROM %s`, "USAGE on sequence"},
		{"no SELECT", `REVOKE SELECT ON %[2]s.idempotency_keys FROM %s`, "SELECT on table"},
		{"no INSERT", `REVOKE INSERT ON %[2]s.idempotency_keys FROM %s`, "INSERT on table"},
		{"no UPDATE", `REVOKE UPDATE ON %[2]s.idempotency_keys FROM %s`, "UPDATE on table"},
		{"no DELETE", `REVOKE DELETE ON %[2]s.idempotency_keys FROM %s`, "DELETE on table"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			grants := grantAll
			if c.revoke != "" {
				grants = append(slices.Clone(grantAll), c.revoke)
			}
			role := testRole(t, pool, "LOGIN", grants...)
			err := idempotency.NewPostgresStore(rolePool(t, pool, role)).Check(t.Context())
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Check with every privilege: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Check: %v, want an error naming %q", err, c.want)
			case c.want != "":
				if r := idempotencytest.StoreReason(t, "Check", err); r != idempotency.ReasonPermission {
					t.Errorf("Check: reason %q, want permission", r)
				}
			}
			var n int
			if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
				t.Errorf("rows after Check: %d, %v; want none", n, err)
			}
		})
	}
}
