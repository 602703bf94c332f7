package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresRoundTripsThroughMiddleware: a new key costs two statements
// (claim, complete); a replay, a 422 and the 409s (in flight, previous
// failed) cost one each.
func TestPostgresRoundTripsThroughMiddleware(t *testing.T) {
	t.Parallel()
	tr := &pgCounter{}
	pool := testdb.New(t, testdb.Tracer(tr))
	var calls atomic.Int64
	h, _ := pgRoute(t, pool, idempotency.Config{}, idempotency.RouteConfig{Name: "orders"}, &calls)
	key := uuid.NewString()
	steps := []struct {
		name, body string
		status     int
		statements int64
	}{
		{"new key", `{"a":1}`, 201, 2},
		{"replay", `{"a":1}`, 201, 1},
		{"mismatch", `{"a":2}`, 422, 1},
	}
	for _, s := range steps {
		before := tr.statements.Load()
		if w := do(h, key, s.body); w.Code != s.status {
			t.Fatalf("%s: status %d", s.name, w.Code)
		}
		if got := tr.statements.Load() - before; got != s.statements {
			t.Fatalf("%s: %d statements, want %d", s.name, got, s.statements)
		}
	}

	// The 409s: a key in flight, then the same key once its handler failed.
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	slow := mw.MustRoute(idempotency.RouteConfig{Name: "slow"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusInternalServerError)
	}))
	key = uuid.NewString()
	first := make(chan int)
	go func() { first <- do(slow, key, `{}`).Code }()
	<-started // claimed: the owner sends nothing more until released
	for _, s := range []struct {
		name, want string
		before     func()
	}{
		{"in flight", "idempotency_in_flight", func() {}},
		{"previous failed", "idempotency_previous_failed", func() {
			close(release)
			if code := <-first; code != 500 {
				t.Fatalf("owner: status %d, want 500", code)
			}
		}},
	} {
		s.before()
		before := tr.statements.Load()
		if w := do(slow, key, `{}`); w.Code != 409 || !strings.Contains(w.Body.String(), s.want) {
			t.Fatalf("%s: %d %s", s.name, w.Code, w.Body)
		}
		if got := tr.statements.Load() - before; got != 1 {
			t.Fatalf("%s: %d statements, want 1", s.name, got)
		}
	}
}

// TestPostgresOutage cuts the connection to Postgres for real with a TCP
// proxy: fail-closed answers 503 within five times the store deadline and
// runs nothing; fail-open runs its handler and counts a bypass; after the
// proxy is restored requests succeed again.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	base := testdb.New(t) // the migrated schema
	schema := base.Config().ConnConfig.RuntimeParams["search_path"]
	target := fmt.Sprintf("%s:%d", base.Config().ConnConfig.Host, base.Config().ConnConfig.Port)
	for _, mode := range []string{"cut", "blackhole"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			proxy := tcpproxy.New(t, target)
			cfg := base.Config().Copy()
			host, port, _ := strings.Cut(proxy.Addr(), ":")
			cfg.ConnConfig.Host = host
			fmt.Sscan(port, &cfg.ConnConfig.Port)
			cfg.ConnConfig.RuntimeParams["search_path"] = schema
			cfg.ConnConfig.ConnectTimeout = time.Second
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				proxy.Close() // first: a request left waiting on a black-holed link ends with it, and the pool can close
				pool.Close()
			}()
			const storeTimeout = 500 * time.Millisecond
			var closedCalls, openCalls atomic.Int64
			mwCfg := idempotency.Config{StoreTimeout: storeTimeout, Lease: 2 * time.Second}
			closed, _ := pgRoute(t, pool, mwCfg, idempotency.RouteConfig{Name: "orders"}, &closedCalls)
			open, reg := pgRoute(t, pool, mwCfg, idempotency.RouteConfig{Name: "billing", FailOpen: true}, &openCalls)
			if w := do(closed, uuid.NewString(), `{}`); w.Code != 201 {
				t.Fatalf("before the outage: %d %s", w.Code, w.Body)
			}
			// A live connection for each route's claim (and the fail-closed
			// claim's background release): a claim that had to
			// connect through the black hole would wait on the pool, 503
			// on every policy (DESIGN-settled-r4 item 4), not an outage.
			held := make([]*pgxpool.Conn, 3) // the third for the fail-closed claim's background release
			for i := range held {
				if held[i], err = pool.Acquire(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range held {
				c.Release()
			}
			if mode == "cut" {
				proxy.Cut()
			} else {
				proxy.Blackhole()
			}
			start := time.Now()
			w := doWithin(t, "fail-closed during the outage", 5*storeTimeout, closed, uuid.NewString(), `{}`)
			if el := time.Since(start); el > 5*storeTimeout {
				t.Fatalf("fail-closed answered after %v, bound %v", el, 5*storeTimeout)
			}
			if w.Code != 503 || w.Header().Get("Retry-After") != "1" || closedCalls.Load() != 1 {
				t.Fatalf("fail-closed during outage: %d %s, calls %d", w.Code, w.Body, closedCalls.Load())
			}
			start = time.Now()
			if w := doWithin(t, "fail-open during the outage", 5*storeTimeout, open, uuid.NewString(), `{}`); w.Code != 201 || openCalls.Load() != 1 {
				t.Fatalf("fail-open during outage: %d, calls %d", w.Code, openCalls.Load())
			}
			if el := time.Since(start); el > 5*storeTimeout {
				t.Fatalf("fail-open answered after %v", el)
			}
			if n := gathered(t, reg, "idempotency_bypasses_total", "billing", "store_unavailable"); n != 1 {
				t.Fatalf("bypasses{billing,store_unavailable} = %v, want 1", n)
			}
			proxy.Restore()
			// The pool reconnects on its own; allow it a few attempts.
			deadline := time.Now().Add(10 * time.Second)
			for {
				if w := do(closed, uuid.NewString(), `{}`); w.Code == 201 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no recovery after the proxy was restored")
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestPostgresPoolExhaustion: with every pool connection held, a claim gives
// up at the store deadline and the fail-closed route answers 503; once the
// connections are free the route recovers.
func TestPostgresPoolExhaustion(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(2))
	var calls atomic.Int64
	const storeTimeout = 500 * time.Millisecond
	h, _ := pgRoute(t, pool, idempotency.Config{StoreTimeout: storeTimeout, Lease: 2 * time.Second},
		idempotency.RouteConfig{Name: "orders"}, &calls)
	var held []*pgxpool.Conn
	releaseHeld := sync.OnceFunc(func() {
		for _, c := range held {
			c.Release()
		}
	})
	t.Cleanup(releaseHeld) // before the pool's own cleanup, which waits for them
	for range 2 {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// Its own deadline: a claim without the store's waits for ever.
	w := doWithin(t, "a claim on an exhausted pool", 5*storeTimeout, h, uuid.NewString(), `{}`)
	if w.Code != 503 || calls.Load() != 0 {
		t.Fatalf("exhausted pool: %d, calls %d", w.Code, calls.Load())
	}
	releaseHeld()
	if w := doWithin(t, "after release", 5*storeTimeout, h, uuid.NewString(), `{}`); w.Code != 201 {
		t.Fatalf("after release: %d %s", w.Code, w.Body)
	}
}
