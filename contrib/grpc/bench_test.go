package idemgrpc_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/idemkit/idempotency/internal/testdb"
	"google.golang.org/grpc/codes"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkUnary: a no-op unary method over loopback from 16 concurrent
// clients, on PostgreSQL, with the interceptor against the same method
// without it, side by side (pairs): a new key per call (grpc/new_keys:
// claim and record) and a key already completed (grpc/replays); and, in
// the same run on the same middleware, the HTTP middleware's ordinary
// route around the same no-op (http/new_keys, http/replays). The table:
// bench/rpc.sh.
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
	httpCall := routertest.Noop(b, mw)
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
			name string
			key  func(n int64) string
		}{
			{"new_keys", func(int64) string { return uuid.NewString() }},
			{"replays", func(n int64) string { return replayKeys[n%16] }},
		} {
			b.Run(tr.name+"/"+c.name, func(b *testing.B) {
				pairs(b, func(ctx context.Context) error { return tr.call(ctx, tr.plain, "") },
					func(ctx context.Context, n int64) error { return tr.call(ctx, tr.keyed, c.key(n)) })
			})
		}
	}
}

// pairs runs plain and keyed calls side by side from 16 clients: each
// client alternates one of each, in alternating order, so both kinds meet
// the same machine at the same moment (this one is shared), and the time
// of each kind is summed apart. It reports plain-ns/call and
// keyed-ns/call, the mean latency of each, and plain/keyed, their ratio:
// the throughput with the middleware over the throughput without it at
// the same concurrency.
func pairs(b *testing.B, plain func(context.Context) error, keyed func(context.Context, int64) error) {
	var plainNs, keyedNs, n atomic.Int64
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := n.Add(1)
			for j := range 2 {
				start := time.Now()
				if (int64(j)+i)%2 == 0 {
					if err := plain(ctx); err != nil {
						b.Error(err)
						return
					}
					plainNs.Add(int64(time.Since(start)))
				} else {
					if err := keyed(ctx, i); err != nil {
						b.Error(err)
						return
					}
					keyedNs.Add(int64(time.Since(start)))
				}
			}
		}
	})
	if calls := float64(n.Load()); calls > 0 {
		p, k := float64(plainNs.Load())/calls, float64(keyedNs.Load())/calls
		b.ReportMetric(p, "plain-ns/call")
		b.ReportMetric(k, "keyed-ns/call")
		b.ReportMetric(p/k, "plain/keyed")
	}
}
