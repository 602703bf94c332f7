package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// TestTxUnavailableIsCounted: every 503 of a transactional route counts as
// a store_unavailable rejection, like the 503s of any other route: a
// COMMIT that fails (with and without a key) and a BEGIN that fails (with
// and without a key), and the failed call counts as a store error of its
// operation (commit, begin).
func TestTxUnavailableIsCounted(t *testing.T) {
	t.Parallel()
	t.Run("commit", func(t *testing.T) {
		t.Parallel()
		f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
		for _, ddl := range []string{
			`CREATE TABLE accounts (id INT PRIMARY KEY)`,
			`CREATE TABLE postings (account INT REFERENCES accounts DEFERRABLE INITIALLY DEFERRED)`,
		} {
			if _, err := f.pool.Exec(t.Context(), ddl); err != nil {
				t.Fatal(err)
			}
		}
		f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
			// A posting to no account: the foreign key, checked at COMMIT,
			// fails it.
			tx, _ := idempotency.TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO postings VALUES (7)`); err != nil {
				t.Error(err)
			}
			return false
		}
		for _, key := range []string{uuid.NewString(), ""} {
			if w := do(h, key, `{}`); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("key %q: %d %s, want 503", key, w.Code, w.Body)
			}
		}
		if n := gathered(t, f.reg, "idempotency_rejections_total", "orders", "store_unavailable"); n != 2 {
			t.Errorf("store_unavailable rejections = %v, want 2 (one per 503)", n)
		}
		// The foreign key's violation (23503) is no outage kind of its own.
		if n := gathered(t, f.reg, "idempotency_store_errors_total", "commit", idempotency.ReasonOther); n != 2 {
			t.Errorf("commit store errors = %v, want 2 (the failed commits)", n)
		}
	})
	t.Run("begin", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		store := beginFails{idempotency.NewMemoryStore()}
		mw, err := idempotency.New(store, idempotency.Config{Registerer: reg, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		var calls int
		h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls++ }))
		key := uuid.NewString()
		for _, k := range []string{key, ""} {
			w := do(h, k, `{}`)
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("key %q: %d %v %s, want 503 with Retry-After: 1", k, w.Code, w.Header(), w.Body)
			}
		}
		if calls != 0 {
			t.Errorf("handler ran %d times without its transaction", calls)
		}
		if n := gathered(t, reg, "idempotency_rejections_total", "orders", "store_unavailable"); n != 2 {
			t.Errorf("store_unavailable rejections = %v, want 2 (one per 503)", n)
		}
		if n := gathered(t, reg, "idempotency_store_errors_total", "begin", idempotency.ReasonConnection); n != 2 {
			t.Errorf("begin store errors = %v, want 2", n)
		}
		// The claimed key was given back: nothing ran under it.
		if recs, err := store.ExportScope(context.Background(), ""); err != nil || len(recs) != 0 {
			t.Errorf("rows left: %v, %v; want none", recs, err)
		}
	})
}

// beginFails is a wrapped store that backs a transactional route but
// cannot begin a transaction.
type beginFails struct{ *idempotency.MemoryStore }

func (beginFails) Begin(context.Context) (idempotency.RouteTx, error) {
	return nil, &idempotency.StoreError{Op: "begin", Reason: idempotency.ReasonConnection, Err: errors.New("connection refused")}
}
