package idemconnect_test

import (
	"context"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// BenchmarkUnary: a no-op unary procedure over loopback (Connect protocol,
// h2c) from 16 concurrent clients, on PostgreSQL, with the interceptor
// against the same procedure without it, side by side (pairs): a new key
// per call (connect/new_keys) and a key already completed
// (connect/replays); and, in the same run on the same middleware, the
// HTTP middleware's ordinary route around the same no-op (http/new_keys,
// http/replays). The table: bench/rpc.sh.
func BenchmarkUnary(b *testing.B) {
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(b, testdb.MaxConns(16))), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		b.Fatal(err)
	}
	ic, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{svc + "Keyed": {RequireKey: true, Route: uuidKeys}})
	if err != nil {
		b.Fatal(err)
	}
	noop := func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return connect.NewResponse(&structpb.Struct{}), nil
	}
	mux := http.NewServeMux()
	mux.Handle(svc+"Keyed", connect.NewUnaryHandler(svc+"Keyed", noop, connect.WithInterceptors(ic)))
	mux.Handle(svc+"Plain", connect.NewUnaryHandler(svc+"Plain", noop))
	base, stop, err := listenH2C(mux)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	hc := h2cClient()
	msg := must(structpb.NewStruct(map[string]any{"amount": 10}))
	clients := map[string]stub{"Plain": dialProc(hc, base, svc+"Plain", wires[0]), "Keyed": dialProc(hc, base, svc+"Keyed", wires[0])}
	connectCall := func(ctx context.Context, procedure, key string) error {
		req := connect.NewRequest(msg)
		if key != "" {
			req.Header().Set(idemconnect.KeyHeader, key)
		}
		_, err := clients[procedure].CallUnary(ctx, req)
		return err
	}
	transports := []struct {
		name         string
		plain, keyed string
		call         func(ctx context.Context, target, key string) error
	}{
		{"connect", "Plain", "Keyed", connectCall},
		{"http", "/plain", "/keyed", routertest.Noop(b, mw)},
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
