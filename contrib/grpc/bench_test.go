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
// clients, on PostgreSQL: without the interceptor (grpc/plain), with it
// and a new key per call (grpc/new_keys: claim and record), and with a
// key already completed (grpc/replays); and, in the same run on the same
// middleware, the HTTP middleware's ordinary route around the same no-op
// (http/plain, http/new_keys, http/replays). Ratios: bench/rpc.sh.
func BenchmarkUnary(b *testing.B) {
	pool := testdb.New(b, testdb.MaxConns(16))
	mw, _ := newMiddleware(b, idempotency.NewPostgresStore(pool), idempotency.Config{})
	noop := func(context.Context, string, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return &testpb.SimpleResponse{ServerId: "1"}, nil
	}
	cc := dial(b, serve(b, mw, map[string]idemgrpc.Method{svc + "Keyed": {RequireKey: true}}, noop, "Keyed", "Plain"))
	req := request("pay 10", codes.OK)
	grpcCall := func(ctx context.Context, method, key string) error {
		if key != "" {
			ctx = withKey(ctx, key)
		}
		_, err := invoke(ctx, cc, method, req)
		return err
	}
	httpCall := httpNoop(b, mw)
	transports := []struct {
		name         string
		plain, keyed string
		call         func(ctx context.Context, target, key string) error
	}{
		{"grpc", "Plain", "Keyed", grpcCall},
		{"http", "/plain", "/keyed", httpCall},
	}
	for _, tr := range transports {
		replayKeys := make([]string, 16)
		for i := range replayKeys {
			replayKeys[i] = uuid.NewString()
			if err := tr.call(b.Context(), tr.keyed, replayKeys[i]); err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range []struct {
			name, target string
			key          func(n int64) string
		}{
			{"plain", tr.plain, func(int64) string { return "" }},
			{"new_keys", tr.keyed, func(int64) string { return uuid.NewString() }},
			{"replays", tr.keyed, func(n int64) string { return replayKeys[n%16] }},
		} {
			b.Run(tr.name+"/"+c.name, func(b *testing.B) {
				var n atomic.Int64
				b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := tr.call(context.Background(), c.target, c.key(n.Add(1))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
