package idempotency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// BenchmarkPostgresTxClaimCommit measures a transactional route's store
// work for a new key: BeginClaim (BEGIN, the session's state and the
// bounds, the lock wait, the claim, the savepoint, the lock wait's end) and Commit
// (the claim's state back, the constraints, the record, COMMIT, the state
// read), with no handler statement between them.
func BenchmarkPostgresTxClaimCommit(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	warm(b, pool)
	s := idempotency.NewPostgresStore(pool)
	hash := strings.Repeat("ab", 32)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8) // 16 clients on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			tx, res, err := s.BeginClaim(ctx, &idempotency.ClaimRequest{
				Key: uuid.NewString(), Scope: "bench", Endpoint: "POST /api/trading/orders",
				RequestHash: hash, TTL: 24 * time.Hour, Lease: 30 * time.Second,
			})
			if err != nil || !res.Won {
				b.Fatalf("BeginClaim: won %v err %v", res.Won, err)
			}
			if err := tx.Commit(ctx, &idempotency.Settlement{Fence: res.Record.Fence(), Response: benchResponse}); err != nil {
				b.Fatalf("Commit: %v", err)
			}
		}
	})
}
