package idempotency_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// benchResponse is a typical order response.
var benchResponse = idempotency.Response{
	Status:   201,
	Header:   http.Header{"Content-Type": {"application/json"}, "Location": {"/api/trading/orders/42"}},
	Body:     []byte(`{"id":42,"symbol":"AAPL","side":"buy","qty":10,"status":"filled","fill_price":187.25}`),
	BodyKind: idempotency.BodyJSON,
}

// BenchmarkPostgresClaimComplete measures the winner's path of the raw
// store: Claim of a new key, then Complete.
func BenchmarkPostgresClaimComplete(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	warm(b, pool)
	s := idempotency.NewPostgresStore(pool)
	hash := strings.Repeat("ab", 32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{
				Key: uuid.NewString(), Scope: "bench", Endpoint: "POST /api/trading/orders",
				RequestHash: hash, TTL: 24 * time.Hour, Lease: 30 * time.Second,
			})
			if err != nil || !res.Won {
				b.Fatalf("Claim: won %v err %v", res.Won, err)
			}
			if err := s.Complete(ctx, res.Record.Fence(), benchResponse); err != nil {
				b.Fatalf("Complete: %v", err)
			}
		}
	})
}

// BenchmarkPostgresClaimReplay measures the loser's path: Claim of a key
// that is already completed, as every replay does.
func BenchmarkPostgresClaimReplay(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	warm(b, pool)
	s := idempotency.NewPostgresStore(pool)
	req := idempotency.ClaimRequest{
		Key: uuid.NewString(), Scope: "bench", Endpoint: "POST /api/trading/orders",
		RequestHash: strings.Repeat("ab", 32), TTL: 24 * time.Hour, Lease: 30 * time.Second,
	}
	res, err := s.Claim(b.Context(), req)
	if err != nil || !res.Won {
		b.Fatalf("Claim: won %v err %v", res.Won, err)
	}
	if err := s.Complete(b.Context(), res.Record.Fence(), benchResponse); err != nil {
		b.Fatalf("Complete: %v", err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			res, err := s.Claim(ctx, req)
			if err != nil || res.Won || res.Record.Status != idempotency.StatusCompleted {
				b.Fatalf("replay Claim: won %v status %s err %v", res.Won, res.Record.Status, err)
			}
		}
	})
}
