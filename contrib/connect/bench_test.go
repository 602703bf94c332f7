package idemconnect_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// BenchmarkUnary: a no-op unary procedure over loopback (Connect protocol,
// HTTP/2) from 16 concurrent clients, on PostgreSQL: without the
// interceptor (plain), with it and a new key per call (new_keys), and with
// a key already completed (replays).
func BenchmarkUnary(b *testing.B) {
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(b, testdb.MaxConns(16))), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		b.Fatal(err)
	}
	ic, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{svc + "Keyed": {RequireKey: true}})
	if err != nil {
		b.Fatal(err)
	}
	noop := func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return connect.NewResponse(&structpb.Struct{}), nil
	}
	mux := http.NewServeMux()
	mux.Handle(svc+"Keyed", connect.NewUnaryHandler(svc+"Keyed", noop, connect.WithInterceptors(ic)))
	mux.Handle(svc+"Plain", connect.NewUnaryHandler(svc+"Plain", noop))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	b.Cleanup(srv.Close)
	msg := must(structpb.NewStruct(map[string]any{"amount": 10}))
	keyed := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+svc+"Keyed")
	replayKeys := make([]string, 16)
	for i := range replayKeys {
		replayKeys[i] = uuid.NewString()
		if _, err := keyed.CallUnary(b.Context(), connectRequest(msg, replayKeys[i])); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, procedure string
		key             func(n int64) string
	}{
		{"plain", "Plain", nil},
		{"new_keys", "Keyed", func(int64) string { return uuid.NewString() }},
		{"replays", "Keyed", func(n int64) string { return replayKeys[n%16] }},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+svc+c.procedure)
			var n atomic.Int64
			b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := connect.NewRequest(msg)
					if c.key != nil {
						req.Header().Set(idemconnect.KeyHeader, c.key(n.Add(1)))
					}
					if _, err := client.CallUnary(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
