package idempotency_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
)

// benchOp is the Do counterpart of benchMiddleware's route: an Operation
// over pool whose function does nothing but return a small value.
func benchOp(b *testing.B, pool *pgxpool.Pool) *idempotency.Operation {
	mw := newMiddleware(b, idempotency.NewPostgresStore(pool), idempotency.Config{})
	op, err := mw.Operation("orders", idempotency.RouteConfig{MinKeyLength: 16}) // UUID keys
	if err != nil {
		b.Fatal(err)
	}
	return op
}

type benchReceipt struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

func noop(context.Context) (benchReceipt, error) { return benchReceipt{ID: 1, Status: "filled"}, nil }

// doOnce runs one Do call and fails the benchmark on an error or an
// unexpected replay.
func doOnce(b *testing.B, op *idempotency.Operation, key string, replayed bool) {
	_, info, err := idempotency.Do(b.Context(), op, idempotency.Call{Key: key, Request: []byte(benchOrder)}, noop)
	if err != nil || info.Replayed != replayed {
		b.Errorf("Do: %+v %v, want replayed %v", info, err, replayed)
	}
}

// BenchmarkPostgresDoMiss is BenchmarkPostgresMiss through Do: a new key
// every call, 16 workers.
func BenchmarkPostgresDoMiss(b *testing.B) {
	op := benchOp(b, benchPool(b))
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			doOnce(b, op, uuid.NewString(), false)
		}
	})
}

// BenchmarkPostgresDoReplay is BenchmarkPostgresReplay through Do: one
// key replayed, 16 workers.
func BenchmarkPostgresDoReplay(b *testing.B) {
	op := benchOp(b, benchPool(b))
	key := uuid.NewString()
	doOnce(b, op, key, false)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			doOnce(b, op, key, true)
		}
	})
}
