package idemconnect_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// classServer serves, over pool, Open (fail-open, ordinary) and Hold
// (transactional; each run signals started and waits for release).
type classServer struct {
	base             string
	runs             *counter
	reg              *prometheus.Registry
	started, release chan struct{}
	done             func() // closes release, once
}

func newClassServer(t *testing.T, pool *pgxpool.Pool, storeTimeout time.Duration) *classServer {
	t.Helper()
	cs := &classServer{runs: &counter{}, reg: prometheus.NewRegistry(), started: make(chan struct{}, 8), release: make(chan struct{})}
	cs.done = sync.OnceFunc(func() { close(cs.release) })
	mw := pgMiddleware(t, pool, idempotency.Config{StoreTimeout: storeTimeout, Lease: 10 * storeTimeout, Registerer: cs.reg})
	hold := func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		cs.started <- struct{}{}
		<-cs.release
		return reply(req, "held"), nil
	}
	cs.base = serveProcs(t, mw, map[string]idemconnect.Method{
		svc + "Open": {Route: idempotency.RouteConfig{FailOpen: true}},
		svc + "Hold": {RequireKey: true, Route: idempotency.RouteConfig{Transactional: true}},
	}, map[string]procFunc{svc + "Open": counted(cs.runs), svc + "Hold": hold})
	// Registered after the pool's and the server's cleanups, so it runs
	// first: a test that fails while handlers hold connections must not
	// leave pool.Close waiting for them.
	t.Cleanup(cs.done)
	return cs
}

// metricSum is the sum of the counters of metric name with a label of
// value label.
func metricSum(t *testing.T, reg *prometheus.Registry, name, label string) (n float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// refused asserts that the fail-open method answers Unavailable
// IDEMPOTENCY_STORE_UNAVAILABLE over each protocol, without running, with
// the claim's store error counted under reason.
func (cs *classServer) refused(t *testing.T, reason string) {
	t.Helper()
	hc := h2cClient()
	for _, w := range wires {
		key := uuid.NewString()
		_, err := call(t.Context(), dialProc(hc, cs.base, svc+"Open", w), key, map[string]any{"a": 1})
		wantAnswer(t, w.name+": fail-open, "+reason, err, connect.CodeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
		if cs.runs.count(key) != 0 {
			t.Fatalf("%s: the fail-open method ran (a bypass) on %s", w.name, reason)
		}
	}
	if n := metricSum(t, cs.reg, "idempotency_store_errors_total", reason); n < float64(len(wires)) {
		t.Errorf("store errors with reason %s: %v, want %d", reason, n, len(wires))
	}
	if n := metricSum(t, cs.reg, "idempotency_bypasses_total", "connect:"+svc+"Open"); n != 0 {
		t.Errorf("bypasses: %v, want 0", n)
	}
}

// TestFailOpenNeedsAnOutage: a fail-open method runs without
// deduplication only during an outage (the store's link cut). Saturation,
// a configuration error, a lock wait and a closed store answer
// Unavailable on it too, as the class table says.
func TestFailOpenNeedsAnOutage(t *testing.T) {
	t.Parallel()
	const storeTimeout = 300 * time.Millisecond

	t.Run("outage", func(t *testing.T) {
		t.Parallel()
		pool, proxy := proxiedPool(t)
		cs := newClassServer(t, pool, storeTimeout)
		proxy.Cut()
		hc := h2cClient()
		for _, w := range wires {
			key := uuid.NewString()
			resp, err := call(t.Context(), dialProc(hc, cs.base, svc+"Open", w), key, map[string]any{"a": 1})
			if err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" || cs.runs.count(key) != 1 {
				t.Fatalf("%s: fail-open during an outage: %v after %d runs; want a bypass", w.name, err, cs.runs.count(key))
			}
		}
		if n := metricSum(t, cs.reg, "idempotency_bypasses_total", "connect:"+svc+"Open"); n != float64(len(wires)) {
			t.Errorf("bypasses: %v, want %d", n, len(wires))
		}
	})

	t.Run("saturated pool", func(t *testing.T) {
		t.Parallel()
		const conns = 2
		cs := newClassServer(t, testdb.New(t, testdb.MaxConns(conns)), storeTimeout)
		var wg sync.WaitGroup
		hold := dialProc(h2cClient(), cs.base, svc+"Hold", wires[0])
		for range conns {
			wg.Go(func() {
				if _, err := call(context.Background(), hold, uuid.NewString(), map[string]any{"a": 1}); err != nil {
					t.Errorf("a transactional call holding a connection: %v", err)
				}
			})
		}
		for range conns { // the barrier: every connection is held by a handler
			<-cs.started
		}
		cs.refused(t, idempotency.ReasonPoolExhausted)
		cs.done()
		wg.Wait()
	})

	t.Run("configuration", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		if _, err := pool.Exec(t.Context(), `DROP TABLE idempotency_keys`); err != nil {
			t.Fatal(err)
		}
		newClassServer(t, pool, storeTimeout).refused(t, idempotency.ReasonSchema)
	})

	t.Run("lock wait", func(t *testing.T) {
		// The production setting: lock_timeout below the store timeout,
		// so a claim queued behind DDL fails with 55P03, not a timeout.
		t.Parallel()
		pool := testdb.New(t, testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "100ms" }))
		ddl, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ddl.Rollback(context.Background()) }()
		if _, err := ddl.Exec(t.Context(), `LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		newClassServer(t, pool, 2*time.Second).refused(t, idempotency.ReasonLockTimeout)
	})

	t.Run("closed store", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		cs := newClassServer(t, pool, storeTimeout)
		pool.Close()
		cs.refused(t, idempotency.ReasonClosed)
	})
}
