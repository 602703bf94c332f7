package idemgrpc_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/testdb"
	"google.golang.org/grpc/codes"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkUnary: a no-op unary method over loopback from 16 concurrent
// clients, on PostgreSQL: without the interceptor (plain), with it and a
// new key per call (new_keys: claim and record), and with a key already
// completed (replays).
func BenchmarkUnary(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	mw, _ := newMiddleware(b, idempotency.NewPostgresStore(pool), idempotency.Config{})
	noop := func(context.Context, string, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return &testpb.SimpleResponse{ServerId: "1"}, nil
	}
	cc := dial(b, serve(b, mw, map[string]idemgrpc.Method{svc + "Keyed": {RequireKey: true}}, noop, "Keyed", "Plain"))
	req := request("pay 10", codes.OK)
	replayKeys := make([]string, 16)
	for i := range replayKeys {
		replayKeys[i] = uuid.NewString()
		if _, err := invoke(withKey(b.Context(), replayKeys[i]), cc, "Keyed", req); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, method string
		key          func(n int64) string
	}{
		{"plain", "Plain", nil},
		{"new_keys", "Keyed", func(int64) string { return uuid.NewString() }},
		{"replays", "Keyed", func(n int64) string { return replayKeys[n%16] }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx := context.Background()
					if c.key != nil {
						ctx = withKey(ctx, c.key(n.Add(1)))
					}
					if _, err := invoke(ctx, cc, c.method, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
