package sqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/operator"
)

// TestPostgresOperatorStats: the operator's stats and cleanup count on the
// PostgreSQL dialect, on both drivers: an empty table counts zeros (its
// ages are NULL in pgsql.StatsSQL), and an expired failed row and a live
// claim are counted where they belong.
func TestPostgresOperatorStats(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			db, _ := pgDB(t, driver, 2)
			s := pgStore(t, db)
			ops, ok := operator.For[idempotency.Record, idempotency.Fence](s)
			if !ok {
				t.Fatal("no operator access to the store")
			}
			if st, err := ops.Stats(ctx); err != nil || st != (operator.Stats{}) {
				t.Fatalf("Stats of an empty table: %+v, %v; want zeros", st, err)
			}
			req := idempotency.ClaimRequest{Key: "k1", Endpoint: "orders", RequestHash: strings.Repeat("ab", 32), TTL: time.Hour, Lease: time.Minute}
			if res, err := s.Claim(ctx, req); err != nil || !res.Won {
				t.Fatalf("Claim: %+v, %v", res, err)
			}
			exec(t, db, `INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	created_at, locked_at, locked_until, expires_at)
VALUES ('k2', '', 'orders', decode(repeat('ab', 32), 'hex'), 'failed', 1,
	now() - interval '2 hours', now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour')`)
			st, err := ops.Stats(ctx)
			if err != nil {
				t.Fatalf("Stats: %v", err)
			}
			if st.Total != 2 || st.InFlight != 1 || st.Failed != 1 || st.AwaitingCleanup != 1 || st.InFlightPastLease != 0 {
				t.Fatalf("Stats: %+v; want 2 rows, 1 in flight, 1 failed awaiting cleanup", st)
			}
			if st.OldestExpiredAge < 50*time.Minute || st.OldestInFlightAge < 0 {
				t.Fatalf("Stats' ages: %+v; want the failed row expired about an hour ago", st)
			}
			if n, err := ops.CountCleanup(ctx); err != nil || n != 1 {
				t.Fatalf("CountCleanup: %d, %v; want 1", n, err)
			}
			if n, err := s.Cleanup(ctx, 10); err != nil || n != 1 {
				t.Fatalf("Cleanup: %d, %v; want the failed row", n, err)
			}
		})
	}
}
