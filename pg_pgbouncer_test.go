package idempotency_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPgBouncerStore runs the store's behaviour suite through PgBouncer in
// transaction mode, with default_query_exec_mode=exec.
func TestPgBouncerStore(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return idempotency.NewPostgresStore(testdb.NewPgBouncer(t))
	})
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

// TestPgBouncerTxStorm: a transactional route through PgBouncer in
// transaction mode with default_query_exec_mode=exec: its transaction
// (claim aside: BEGIN, the handler's INSERT, the record with JSON headers
// and body, COMMIT) stays on one server connection; one order per key, and
// the replay is the recorded answer.
func TestPgBouncerTxStorm(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	pool := testdb.NewPgBouncer(t, testdb.MaxConns(16))
	if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg := raceConfig
	cfg.Registerer, cfg.Logger = prometheus.NewRegistry(), quiet
	cfg.Enabled = func(*http.Request) bool { return true }
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, _ := idempotency.TxFromContext(r.Context())
		key, _ := idempotency.KeyFromContext(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (idem_key) VALUES ($1) RETURNING id`, key).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}))
	keys := newKeys(10)
	race(t, []http.Handler{h}, keys, 16)
	var orders, perKey int
	if err := pool.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT idem_key) FROM orders`).Scan(&orders, &perKey); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 10 || orders != 10 || perKey != 10 {
		t.Fatalf("executions %d, orders %d for %d keys, want 10, 10, 10", calls.Load(), orders, perKey)
	}
	first, again := do(h, keys[0], `{"qty":1}`), do(h, keys[0], `{"qty":1}`)
	if again.Code != 201 || again.Header().Get("Location") != first.Header().Get("Location") || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay %d %v %s, want the recorded 201 with Location %q", again.Code, again.Header(), again.Body, first.Header().Get("Location"))
	}
}

// TestPgBouncerStatementCacheNamesTheSetting: with pgx's default statement
// cache, two clients of one server connection collide on its named
// statements; the store's error names the setting that fixes it.
func TestPgBouncerStatementCacheNamesTheSetting(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	cached := testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		c.MaxConns = 1
	})
	a := testdb.NewPgBouncer(t, cached)
	b, err := pgxpool.NewWithConfig(t.Context(), a.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	stores := []idempotency.Store{idempotency.NewPostgresStore(a), idempotency.NewPostgresStore(b)}
	failed := 0
	for i := range 20 {
		_, err := stores[i%2].Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if err == nil {
			continue
		}
		failed++
		if !errors.Is(err, idempotency.ErrStoreUnavailable) || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Fatalf("claim %d: %v; want a store error naming default_query_exec_mode", i, err)
		}
	}
	if failed == 0 {
		t.Fatal("20 claims from two clients with statement caches through PgBouncer all succeeded; the test no longer sees the collision")
	}
	t.Logf("%d of 20 claims failed with the setting named", failed)
}
