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

// TestPostgresCleanupPlansEachBatch: on a driver that prepares its
// statements (pgx's stdlib), cleanup's two statements are planned for each
// batch, never on a plan the connection keeps. Their batch size is a
// parameter; a kept plan, made once while the table was small, joins a
// batch to every expired row (a bitmap scan of idx_idem_keys_retain), and
// nothing but an ANALYZE replaces it while the table grows: each batch of a
// backlog then reads the whole backlog. (lib/pq sends unnamed statements,
// which PostgreSQL always plans afresh.)
func TestPostgresCleanupPlansEachBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db, _ := pgDB(t, "pgx", 1)
	s := pgStore(t, db)
	for range 10 { // PostgreSQL weighs a kept plan after five calls
		if _, err := s.Cleanup(ctx, 100); err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int64
	if err := db.QueryRowContext(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE 'WITH batch AS%'`).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic != 0 || custom < 20 {
		t.Errorf("cleanup's statements over 10 batches: %d generic plans, %d custom plans; want 0 and at least 20", generic, custom)
	}
}
