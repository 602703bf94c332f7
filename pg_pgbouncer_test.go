package idempotency_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/storetest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPgBouncerStore runs the store's behaviour suite through PgBouncer in
// transaction mode, with default_query_exec_mode=exec.
func TestPgBouncerStore(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	storetest.Run(t, func(t *testing.T) idempotency.Store {
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
		_, err := stores[i%2].Claim(t.Context(), pgRequest("u", time.Hour, time.Minute))
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
