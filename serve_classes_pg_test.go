package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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

// classRoutes is a middleware over a Postgres store with a fail-open
// ordinary route (billing) and a transactional route (orders), whose
// handler runs block until released when block is set.
type classRoutes struct {
	billing, orders http.Handler
	billed, ordered atomic.Int64
	reg             *prometheus.Registry
	logs            *logBuffer
	started         chan struct{} // one value per orders handler that started
	release         chan struct{} // closed: orders handlers return
}

func newClassRoutes(t *testing.T, pool *pgxpool.Pool, storeTimeout time.Duration) *classRoutes {
	t.Helper()
	c := &classRoutes{reg: prometheus.NewRegistry(), started: make(chan struct{}, 16), release: make(chan struct{})}
	logger, buf := newLogBuffer()
	c.logs = buf
	mw := newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{
		StoreTimeout: storeTimeout, Lease: 10 * storeTimeout, Registerer: c.reg, Logger: logger,
		Scope: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-User")
		},
	})
	c.billing = mw.MustRoute(idempotency.RouteConfig{Name: "billing", FailOpen: true})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			c.billed.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
	c.orders = mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			c.ordered.Add(1)
			c.started <- struct{}{}
			<-c.release
			w.WriteHeader(http.StatusCreated)
		}))
	return c
}

// sendAs posts to h with key and the user scope user, bounded by doBound.
func sendAs(h http.Handler, key, user string) *httptest.ResponseRecorder {
	return sendAsWithin(h, key, user, doBound)
}

// sendAsWithin is sendAs bounded by wait (serveWithin).
func sendAsWithin(h http.Handler, key, user string, wait time.Duration) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/x", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, key)
	r.Header.Set("X-User", user)
	return serveWithin(h, r, wait)
}

// refused asserts that the fail-open route answered 503 without running
// its handler or counting a bypass, counted the claim's store error under
// reason, and logged it at level with the key and the scope.
func (c *classRoutes) refused(t *testing.T, w *httptest.ResponseRecorder, key, reason, level string) {
	t.Helper()
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || c.billed.Load() != 0 {
		t.Fatalf("fail-open route: %d %s (Retry-After %q), handler runs %d; want 503 and no run",
			w.Code, w.Body, w.Header().Get("Retry-After"), c.billed.Load())
	}
	if n := gathered(t, c.reg, "idempotency_bypasses_total", "billing", "store_unavailable"); n != 0 {
		t.Errorf("bypasses = %v, want 0", n)
	}
	if n := gathered(t, c.reg, "idempotency_rejections_total", "billing", "store_unavailable"); n != 1 {
		t.Errorf("store_unavailable rejections = %v, want 1", n)
	}
	if n := gathered(t, c.reg, "idempotency_store_errors_total", "claim", reason); n != 1 {
		t.Errorf("store errors {claim, %s} = %v, want 1", reason, n)
	}
	c.logged(t, key, reason, level)
}

// logged asserts one log line at level carrying the key, the scope u1 and
// reason.
func (c *classRoutes) logged(t *testing.T, key, reason, level string) {
	t.Helper()
	for _, line := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(line, `"level":"`+level+`"`) && strings.Contains(line, `"reason":"`+reason+`"`) &&
			strings.Contains(line, `"key":"`+key+`"`) && strings.Contains(line, `"scope":"u1"`) {
			return
		}
	}
	t.Errorf("no %s log line with key, scope u1 and reason %s:\n%s", level, reason, c.logs)
}

// TestPostgresFailOpenNeedsAnOutage: a fail-open route runs its handler
// without deduplication only when the database failed. A pool saturated by
// slow transactional handlers, a refused login, a missing table or a
// missing grant is 503 on it too.
func TestPostgresFailOpenNeedsAnOutage(t *testing.T) {
	t.Parallel()
	// storeTimeout bounds the saturated pool's wait and the cut link's
	// claim. classTimeout is the store timeout of the subtests whose answer
	// is the database's error: their first claim also connects (a new pool,
	// a role's login), which on a loaded CI machine took longer than 300 ms
	// and read as a timeout instead of the class under test.
	const storeTimeout, classTimeout = 300 * time.Millisecond, 2 * time.Second

	t.Run("saturated pool", func(t *testing.T) {
		t.Parallel()
		const conns = 2
		c := newClassRoutes(t, testdb.New(t, testdb.MaxConns(conns)), storeTimeout)
		var wg sync.WaitGroup
		codes := make(chan int, conns)
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A handler that started holds its connection until
				// release, so a 503 comes from a claim that never ran (a
				// loaded machine's store timeout): claim again, or the
				// barrier below waits for ever.
				key := uuid.NewString()
				code := sendAs(c.orders, key, "u1").Code
				for try := 0; code == http.StatusServiceUnavailable && try < 20; try++ {
					code = sendAs(c.orders, key, "u1").Code
				}
				codes <- code
			}()
		}
		for range conns { // the barrier: every connection is held by a handler
			select {
			case <-c.started:
			case <-time.After(time.Minute): // never hangs: 200 store timeouts
				close(c.release)
				t.Fatal("the slow transactional requests never all started")
			}
		}
		key := uuid.NewString()
		w := sendAsWithin(c.billing, key, "u1", 5*storeTimeout) // its own deadline: a claim without the store's waits for ever
		close(c.release)
		wg.Wait()
		close(codes)
		for code := range codes {
			if code != http.StatusCreated {
				t.Errorf("a slow transactional request answered %d, want 201", code)
			}
		}
		c.refused(t, w, key, idempotency.ReasonPoolExhausted, "WARN")
		if !strings.Contains(c.logs.String(), "pool") {
			t.Errorf("the saturation is not logged as the pool's:\n%s", c.logs)
		}
	})

	t.Run("refused login", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		c := newClassRoutes(t, rolePool(t, pool, testRole(t, pool, "NOLOGIN")), classTimeout)
		key := uuid.NewString()
		c.refused(t, sendAs(c.billing, key, "u1"), key, idempotency.ReasonAuth, "ERROR")
	})

	t.Run("no table", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		if _, err := pool.Exec(t.Context(), `DROP TABLE idempotency_keys`); err != nil {
			t.Fatal(err)
		}
		c := newClassRoutes(t, pool, classTimeout)
		key := uuid.NewString()
		c.refused(t, sendAs(c.billing, key, "u1"), key, idempotency.ReasonSchema, "ERROR")
	})

	t.Run("no USAGE on the sequence", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		role := testRole(t, pool, "LOGIN", append(grantAll[:2:2], `GRANT SELECT ON SEQUENCE %[2]s.idempotency_keys_id_seq TO %s`)...)
		c := newClassRoutes(t, rolePool(t, pool, role), classTimeout)
		key := uuid.NewString()
		c.refused(t, sendAs(c.billing, key, "u1"), key, idempotency.ReasonPermission, "ERROR")
	})

	t.Run("cut link", func(t *testing.T) {
		// The outage the bypass is for: it still runs, and its WARN names
		// the key and the scope, so the request can be reconciled.
		t.Parallel()
		base := testdb.New(t)
		cfg := base.Config()
		proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
		host, port, _ := strings.Cut(proxy.Addr(), ":")
		pool := testdb.New(t, testdb.Configure(func(c *pgxpool.Config) {
			c.ConnConfig.Host = host
			fmt.Sscan(port, &c.ConnConfig.Port)
			c.ConnConfig.Fallbacks = nil
			c.ConnConfig.ConnectTimeout = time.Second
		}))
		c := newClassRoutes(t, pool, storeTimeout)
		proxy.Cut()
		key := uuid.NewString()
		if w := sendAs(c.billing, key, "u1"); w.Code != http.StatusCreated || c.billed.Load() != 1 {
			t.Fatalf("fail-open route during an outage: %d %s, runs %d; want the handler's 201", w.Code, w.Body, c.billed.Load())
		}
		if n := gathered(t, c.reg, "idempotency_bypasses_total", "billing", "store_unavailable"); n != 1 {
			t.Errorf("bypasses = %v, want 1", n)
		}
		c.logged(t, key, idempotency.ReasonConnection, "WARN")
	})
}
