package idemgrpc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// classServer serves, over pool, Open (fail-open, ordinary) and Hold
// (transactional; each run signals started and waits for release).
type classServer struct {
	cc               *grpc.ClientConn
	runs             *runs
	reg              *prometheus.Registry
	started, release chan struct{}
	done             func() // closes release, once
}

func newClassServer(t *testing.T, pool *pgxpool.Pool, storeTimeout time.Duration) *classServer {
	t.Helper()
	cs := &classServer{runs: &runs{}, started: make(chan struct{}, 8), release: make(chan struct{})}
	cs.done = sync.OnceFunc(func() { close(cs.release) })
	var mw *idempotency.Middleware
	mw, cs.reg = newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{StoreTimeout: storeTimeout, Lease: 10 * storeTimeout})
	h := func(ctx context.Context, method string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		if method == svc+"Hold" {
			cs.started <- struct{}{}
			<-cs.release
		}
		return answer(req, cs.runs.note(ctx))
	}
	cs.cc = dial(t, serve(t, mw, map[string]idemgrpc.Method{
		svc + "Open": {Route: idempotency.RouteConfig{FailOpen: true}},
		svc + "Hold": {RequireKey: true, Route: idempotency.RouteConfig{Transactional: true}},
	}, h, "Open", "Hold"))
	// Registered after the pool's and the server's cleanups, so it runs
	// first: a test that fails while handlers hold connections must not
	// leave pool.Close waiting for them.
	t.Cleanup(cs.done)
	return cs
}

// counted is the sum of the counters of metric name with a label of value.
func counted(t *testing.T, reg *prometheus.Registry, name, value string) (n float64) {
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
				if l.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// refused asserts that the fail-open method answers Unavailable
// IDEMPOTENCY_STORE_UNAVAILABLE without running, with the claim's store
// error counted under reason and no bypass.
func (cs *classServer) refused(t *testing.T, reason string) {
	t.Helper()
	key := uuid.NewString()
	_, err := invoke(withKey(t.Context(), key), cs.cc, "Open", request("a", codes.OK))
	wantAnswer(t, "fail-open, "+reason, err, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
	if cs.runs.count(key) != 0 {
		t.Fatalf("the fail-open method ran (a bypass) on %s", reason)
	}
	if n := counted(t, cs.reg, "idempotency_store_errors_total", reason); n < 1 {
		t.Errorf("store errors with reason %s: %v, want 1", reason, n)
	}
	if n := counted(t, cs.reg, "idempotency_bypasses_total", "grpc:"+svc+"Open"); n != 0 {
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
		var proxy *tcpproxy.Proxy
		pool := testdb.New(t, testdb.Configure(func(c *pgxpool.Config) {
			proxy = tcpproxy.New(t, fmt.Sprintf("%s:%d", c.ConnConfig.Host, c.ConnConfig.Port))
			host, port, _ := strings.Cut(proxy.Addr(), ":")
			c.ConnConfig.Host, c.ConnConfig.Port = host, uint16(atoi(t, port))
			c.ConnConfig.Fallbacks = nil
			c.ConnConfig.ConnectTimeout = time.Second
		}))
		cs := newClassServer(t, pool, storeTimeout)
		proxy.Cut()
		key := uuid.NewString()
		var hd metadata.MD
		if _, err := invoke(withKey(t.Context(), key), cs.cc, "Open", request("a", codes.OK), grpc.Header(&hd)); err != nil || replayed(hd) || cs.runs.count(key) != 1 {
			t.Fatalf("fail-open during an outage: %v after %d runs; want a bypass", err, cs.runs.count(key))
		}
		if n := counted(t, cs.reg, "idempotency_bypasses_total", "grpc:"+svc+"Open"); n != 1 {
			t.Errorf("bypasses: %v, want 1", n)
		}
	})

	t.Run("saturated pool", func(t *testing.T) {
		t.Parallel()
		const conns = 2
		cs := newClassServer(t, testdb.New(t, testdb.MaxConns(conns)), storeTimeout)
		var wg sync.WaitGroup
		for range conns {
			wg.Go(func() {
				if _, err := invoke(withKey(context.Background(), uuid.NewString()), cs.cc, "Hold", request("a", codes.OK)); err != nil {
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
