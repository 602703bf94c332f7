package idempotency_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
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
