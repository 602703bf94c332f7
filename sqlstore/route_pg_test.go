package sqlstore_test

import (
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/sqlstore"
)

// TestPostgresSessionChangesDoNotOutliveTheRoute: a handler that runs SET
// search_path and SET statement_timeout without LOCAL on the lent
// transaction leaves nothing on the pooled connection (RESET ALL after
// COMMIT), and the store's statements name their table qualified, so
// every later claim reaches the store's table (DESIGN-settled-r3 item 6).
func TestPostgresSessionChangesDoNotOutliveTheRoute(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, schema := pgDB(t, driver, 1)
			s := pgStore(t, db)
			exec(t, db, "CREATE SCHEMA IF NOT EXISTS other_"+schema, "CREATE TABLE other_"+schema+".idempotency_keys (LIKE "+schema+".idempotency_keys INCLUDING ALL)")
			t.Cleanup(func() { exec(t, db, "DROP SCHEMA other_"+schema+" CASCADE") })
			h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
				tx, _ := sqlstore.TxFromContext(r.Context())
				// A statement_timeout the record could outlive: at 1 ms the
				// statement that puts the claim's bound back can itself be
				// cancelled on a loaded machine (the key then fails, safely),
				// which is not what this test is about.
				for _, stmt := range []string{"SET search_path TO other_" + schema, "SET statement_timeout = 30000"} {
					if _, err := tx.ExecContext(r.Context(), stmt); err != nil {
						t.Errorf("%s: %v", stmt, err)
					}
				}
				w.WriteHeader(http.StatusCreated)
			})
			for range 3 {
				if code, body, _ := post(t, h, uuid.NewString(), "x"); code != http.StatusCreated {
					t.Fatalf("order: %d %s", code, body)
				}
			}
			if n := countRows(t, db, schema+".idempotency_keys"); n != 3 {
				t.Fatalf("the store's table holds %d keys, want 3", n)
			}
			if n := countRows(t, db, "other_"+schema+".idempotency_keys"); n != 0 {
				t.Fatalf("the other schema's table holds %d keys, want 0", n)
			}
			var path, timeout string
			if err := db.QueryRowContext(t.Context(), "SELECT current_setting('search_path'), current_setting('statement_timeout')").Scan(&path, &timeout); err != nil {
				t.Fatal(err)
			}
			if path != schema || timeout != "0" {
				t.Fatalf("pooled connection after the routes: search_path %q, statement_timeout %q; want %q and 0", path, timeout, schema)
			}
		})
	}
}
