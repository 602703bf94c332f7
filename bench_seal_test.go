package idempotency_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// BenchmarkSealing times a miss and a replay of the order route with
// sealing off and on, side by side: every client alternates a plain and a
// sealed request (in alternating order), so both see the same machine at
// the same moment. Besides ns/op (one plain plus one sealed request), it
// reports each kind's ns per request and their ratio, plain over sealed:
// the throughput sealing keeps (1 is free; the target is at least 0.95).
// On the memory store the middleware's own cost is all there is, so the
// ratio is the worst case; on Postgres, 16 clients on a pool of 8, it is
// what a service sees.
//
//	go test -run '^$' -bench BenchmarkSealing -count 5 .
func BenchmarkSealing(b *testing.B) {
	for _, backend := range []string{"Memory", "Postgres"} {
		for _, kind := range []string{"Miss", "Replay"} {
			b.Run(backend+"/"+kind, func(b *testing.B) { benchSealing(b, backend, kind == "Replay") })
		}
	}
}

func benchSealing(b *testing.B, backend string, replay bool) {
	keys := sealKeysOf(b, "k1")
	var plainStore, sealedStore idempotency.Store
	if backend == "Postgres" {
		pg := idempotency.NewPostgresStore(benchPool(b))
		plainStore, sealedStore = pg, sealing(b, pg, keys)
	} else {
		plainStore, sealedStore = idempotency.NewMemoryStore(), sealing(b, idempotency.NewMemoryStore(), keys)
	}
	routes := [2]http.Handler{benchRouteOn(b, plainStore), benchRouteOn(b, sealedStore)}
	var replayKeys [2]string
	for i, h := range routes {
		replayKeys[i] = uuid.NewString()
		newClient().serve(b, h, replayKeys[i])
	}
	var spent [2]atomic.Int64 // ns in plain and sealed requests
	round := func(c *client, n int) {
		for j := range 2 {
			i := (n + j) % 2 // plain first on even rounds, sealed first on odd ones
			key := replayKeys[i]
			if !replay {
				key = uuid.NewString()
			}
			start := time.Now()
			c.serve(b, routes[i], key)
			spent[i].Add(int64(time.Since(start)))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	if backend == "Postgres" {
		b.SetParallelism(8) // 16 clients on 2 cores, as the load tests use
		b.RunParallel(func(pb *testing.PB) {
			c := newClient()
			for n := 0; pb.Next(); n++ {
				round(c, n)
			}
		})
	} else {
		c := newClient()
		for n := 0; b.Loop(); n++ {
			round(c, n)
		}
	}
	plain, sealed := float64(spent[0].Load()), float64(spent[1].Load())
	b.ReportMetric(plain/float64(b.N), "plain-ns/req")
	b.ReportMetric(sealed/float64(b.N), "sealed-ns/req")
	b.ReportMetric(plain/sealed, "ratio")
}

// benchRouteOn is the order route over store, answering the benchmark's
// order.
func benchRouteOn(b *testing.B, store idempotency.Store) http.Handler {
	mw := newMiddleware(b, store, idempotency.Config{})
	return mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(orderResponse)
	}))
}
