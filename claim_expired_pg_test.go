package idempotency_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestExpiredRefusePostgres: on PostgresStore, ordinary and transactional
// routes alike, a key past its TTL under ExpiredRefuse answers 422
// idempotency_key_expired to the same body and another, running nothing;
// cleanup purges its response at expiry and keeps the row, deletes it
// after the grace, and the key then runs again. Time passes by moving the
// row's times back (age).
func TestExpiredRefusePostgres(t *testing.T) {
	t.Parallel()
	for _, tx := range []bool{false, true} {
		t.Run(map[bool]string{false: "Ordinary", true: "Transactional"}[tx], func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			ctx := t.Context()
			age := func() {
				t.Helper()
				_, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - interval '61 minutes',
					locked_at = locked_at - interval '61 minutes', locked_until = locked_until - interval '61 minutes',
					expires_at = expires_at - interval '61 minutes', retain_until = retain_until - interval '61 minutes'`)
				if err != nil {
					t.Fatalf("age the rows: %v", err)
				}
			}
			cleanup := func() {
				t.Helper()
				if _, err := idempotency.NewPostgresStore(pool).Cleanup(ctx, 100); err != nil {
					t.Fatalf("Cleanup: %v", err)
				}
			}
			var calls atomic.Int64
			h, reg := pgRoute(t, pool, idempotency.Config{}, idempotency.RouteConfig{Name: "orders", Transactional: tx,
				TTL: time.Hour, Expired: idempotency.ExpiredRefuse, Grace: time.Hour}, &calls)
			key := uuid.NewString()
			if w := do(h, key, `{"qty":1}`); w.Code != 201 {
				t.Fatalf("first call: %d %s", w.Code, w.Body)
			}
			age()
			for _, body := range []string{`{"qty":1}`, `{"qty":2}`} {
				if w := do(h, key, body); w.Code != 422 || !strings.Contains(w.Body.String(), "idempotency_key_expired") {
					t.Fatalf("past the TTL, body %s: %d %s; want 422 idempotency_key_expired", body, w.Code, w.Body)
				}
			}
			if n := gathered(t, reg, "idempotency_conflicts_total", "orders", "key_expired"); n != 2 {
				t.Errorf(`idempotency_conflicts_total{reason="key_expired"} = %v, want 2`, n)
			}
			cleanup()
			var rows, kept int
			err := pool.QueryRow(ctx, `SELECT count(*), count(response_body) + count(response_body_raw) + count(response_headers) + count(seal_key_id)
				FROM idempotency_keys WHERE response_code = 201 AND status = 'completed'`).Scan(&rows, &kept)
			if err != nil || rows != 1 || kept != 0 {
				t.Fatalf("after cleanup at expiry: %d rows, %d response columns (%v); want the row, its response purged", rows, kept, err)
			}
			if w := do(h, key, `{"qty":1}`); w.Code != 422 || calls.Load() != 1 {
				t.Fatalf("a purged tombstone: %d, %d executions; want 422 and 1", w.Code, calls.Load())
			}
			age()
			cleanup()
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("after cleanup past the grace: %d rows (%v), want none", rows, err)
			}
			if w := do(h, key, `{"qty":2}`); w.Code != 201 || calls.Load() != 2 {
				t.Fatalf("after the grace: %d %s, %d executions; want a new execution", w.Code, w.Body, calls.Load())
			}

			// A purged tombstone past its grace that cleanup has not deleted
			// yet is taken over as a new key: its new life's response is
			// purged at its own expiry (the takeover clears purged, or the
			// row would stay out of idx_idem_keys_purge with a response).
			age()
			cleanup() // purges the second life's response
			age()     // past the grace, not deleted: no cleanup
			purged := func() (p bool) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT purged FROM idempotency_keys`).Scan(&p); err != nil {
					t.Fatal(err)
				}
				return p
			}
			if !purged() {
				t.Fatal("cleanup purged the tombstone's response but did not mark it purged")
			}
			if w := do(h, key, `{"qty":3}`); w.Code != 201 || calls.Load() != 3 {
				t.Fatalf("a tombstone past its grace, not deleted: %d %s, %d executions; want a new execution", w.Code, w.Body, calls.Load())
			}
			if purged() {
				t.Fatal("the takeover kept purged: the new response would outlive its TTL")
			}
			age()
			cleanup()
			if err := pool.QueryRow(ctx, `SELECT count(response_body) + count(response_body_raw) + count(response_headers) + count(seal_key_id)
				FROM idempotency_keys`).Scan(&kept); err != nil || kept != 0 {
				t.Fatalf("the taken-over key past its TTL: %d response columns left (%v), want none", kept, err)
			}
		})
	}
}
