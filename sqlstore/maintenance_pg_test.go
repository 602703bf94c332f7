package sqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// TestPostgresCleanup: Cleanup on the PostgreSQL dialect, through
// internal/pgsql's statement, on both drivers: an expired failed row goes,
// a live claim stays.
func TestPostgresCleanup(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			db, _ := pgDB(t, driver, 2)
			s := pgStore(t, db)
			if n, err := s.Cleanup(ctx, 10); err != nil || n != 0 {
				t.Fatalf("Cleanup of an empty table: %d, %v; want 0", n, err)
			}
			req := idempotency.ClaimRequest{Key: "k1", Endpoint: "orders", RequestHash: strings.Repeat("ab", 32), TTL: time.Hour, Lease: time.Minute}
			if res, err := s.Claim(ctx, req); err != nil || !res.Won {
				t.Fatalf("Claim: %+v, %v", res, err)
			}
			exec(t, db, `INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	created_at, locked_at, locked_until, expires_at)
VALUES ('k2', '', 'orders', decode(repeat('ab', 32), 'hex'), 'failed', 1,
	now() - interval '2 hours', now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour')`)
			if n, err := s.Cleanup(ctx, 10); err != nil || n != 1 {
				t.Fatalf("Cleanup: %d, %v; want the failed row", n, err)
			}
			recs, err := s.ExportScope(ctx, "")
			if err != nil || len(recs) != 1 || recs[0].Key != "k1" {
				t.Fatalf("after Cleanup: %+v, %v; want the live claim k1 alone", recs, err)
			}
		})
	}
}
