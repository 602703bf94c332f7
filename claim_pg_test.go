package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresRaceOnePool: 20 keys x 64 goroutines through one middleware:
// exactly 20 executions.
func TestPostgresRaceOnePool(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(16))
	var calls atomic.Int64
	h, _ := pgRoute(t, pool, raceConfig, idempotency.RouteConfig{Name: "orders"}, &calls)
	race(t, []http.Handler{h}, newKeys(20), 64)
	if calls.Load() != 20 {
		t.Fatalf("executions = %d, want 20", calls.Load())
	}
}

// TestPostgresRaceTwoPools: the same race through two middleware instances
// with two pools on one database (two servers): exactly 20 executions.
func TestPostgresRaceTwoPools(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	var calls atomic.Int64
	var handlers []http.Handler
	for range 2 {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 8
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		h, _ := pgRoute(t, pool, raceConfig, idempotency.RouteConfig{Name: "orders"}, &calls)
		handlers = append(handlers, h)
	}
	race(t, handlers, newKeys(20), 64)
	if calls.Load() != 20 {
		t.Fatalf("executions = %d, want 20", calls.Load())
	}
}

// TestPostgresContentionIsInFlight: host sessions at SERIALIZABLE or
// REPEATABLE READ on a hot key whose row is deleted again and again (a
// NoStore route releases it on every completion, a 429 releases it too)
// make claims lose to serialization failures past their retries. That is
// contention, not an outage: 409 in flight on a fail-open route too, never
// a bypass that runs the handler while another request owns the key.
func TestPostgresContentionIsInFlight(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		isolation string
		rc        idempotency.RouteConfig
		status    int
	}{
		{"serializable", idempotency.RouteConfig{Name: "profile", FailOpen: true, NoStore: true}, 200},
		{"repeatable read", idempotency.RouteConfig{Name: "billing", FailOpen: true}, 429},
	} {
		t.Run(c.isolation, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t, testdb.MaxConns(8), testdb.Configure(func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = c.isolation
			}))
			reg := prometheus.NewRegistry()
			mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
				Registerer: reg, Logger: quiet, Enabled: func(context.Context) bool { return true },
				StoreTimeout: 10 * time.Second, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var running, overlaps, calls atomic.Int64
			h := mw.MustRoute(c.rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				if running.Add(1) > 1 {
					overlaps.Add(1)
				}
				runtime.Gosched() // let another run start, if one can
				running.Add(-1)
				w.WriteHeader(c.status)
			}))
			key := uuid.NewString()
			var wg sync.WaitGroup
			stop := time.Now().Add(4 * time.Second)
			unexpected := make(chan string, 1)
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						w := do(h, key, `{}`)
						if w.Code != c.status && !(w.Code == 409 && strings.Contains(w.Body.String(), "idempotency_in_flight")) {
							select {
							case unexpected <- fmt.Sprintf("%d %s", w.Code, w.Body):
							default:
							}
						}
					}
				}()
			}
			wg.Wait()
			close(unexpected)
			for u := range unexpected {
				t.Errorf("unexpected answer: %s", u)
			}
			var bypasses float64
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range families {
				if f.GetName() == "idempotency_bypasses_total" {
					for _, m := range f.GetMetric() {
						bypasses += m.GetCounter().GetValue()
					}
				}
			}
			if bypasses != 0 || overlaps.Load() != 0 {
				t.Fatalf("%v bypasses, %d overlapping handler runs for one key (of %d runs); want none", bypasses, overlaps.Load(), calls.Load())
			}
			if calls.Load() == 0 {
				t.Fatal("the handler never ran")
			}
		})
	}
}

// TestPostgresMismatchCheckedBeforeStatus: on Postgres too, a different
// body on a key in flight or failed is 422, not that state's 409.
func TestPostgresMismatchCheckedBeforeStatus(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusInternalServerError)
	}))
	key := uuid.NewString()
	first := make(chan int)
	go func() { first <- do(h, key, `{"qty":1}`).Code }()
	<-started
	check := func(state, want string) {
		t.Helper()
		if w := do(h, key, `{"qty":2}`); w.Code != 422 || w.Body.String() != `{"error":"idempotency_key_body_mismatch"}` {
			t.Fatalf("%s, different body: %d %s, want 422", state, w.Code, w.Body)
		}
		if w := do(h, key, `{"qty":1}`); w.Code != 409 || !strings.Contains(w.Body.String(), want) {
			t.Fatalf("%s, same body: %d %s, want 409 %s", state, w.Code, w.Body, want)
		}
	}
	check("in flight", "idempotency_in_flight")
	close(release)
	if code := <-first; code != 500 {
		t.Fatalf("owner: %d, want 500", code)
	}
	check("failed", "idempotency_previous_failed")
}

// TestPgBouncerRaceTwoPools: two middleware instances on two pools through
// PgBouncer, whose transactions share two server connections: exactly one
// execution per key, and a transactional route's transaction stays on one
// server connection.
func TestPgBouncerRaceTwoPools(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	first := testdb.NewPgBouncer(t)
	second, err := pgxpool.NewWithConfig(t.Context(), first.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	var calls atomic.Int64
	var handlers []http.Handler
	for _, pool := range []*pgxpool.Pool{first, second} {
		h, _ := pgRoute(t, pool, raceConfig, idempotency.RouteConfig{Name: "orders"}, &calls)
		handlers = append(handlers, h)
	}
	race(t, handlers, newKeys(10), 32)
	if calls.Load() != 10 {
		t.Fatalf("executions = %d, want 10", calls.Load())
	}
}
