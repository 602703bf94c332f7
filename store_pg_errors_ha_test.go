package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresRetriesAfterConnectionLoss: a claim, a takeover and an
// export whose pooled connection the server has ended succeed on a new
// connection, instead of failing the request.
func TestPostgresRetriesAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(1), neverPing)
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	first := idempotencytest.Request("u", time.Millisecond, time.Minute)
	if err := pool.Ping(ctx); err != nil { // opens the connection
		t.Fatal(err)
	}
	terminateIdle(t, pool)
	rec := idempotencytest.MustClaim(t, s, first) // fails without the retry
	if err := s.Complete(ctx, rec.Fence(), rec, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	expired := idempotencytest.WaitFor(t, s, first, "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

	terminateIdle(t, pool)
	res, err := s.Takeover(ctx, expired.Fence(), first)
	if err != nil || !res.Won {
		t.Fatalf("Takeover after the connection was ended: %+v, %v", res, err)
	}

	terminateIdle(t, pool)
	recs, err := s.ExportScope(ctx, "u")
	if err != nil || len(recs) != 1 {
		t.Fatalf("ExportScope after the connection was ended: %d records, %v", len(recs), err)
	}
}

// TestPostgresRetriesConnectionLossOnce: when the retry's connection is
// dead too, the claim fails with reason connection (no loop), and the
// next claim, on a fresh connection, succeeds.
func TestPostgresRetriesConnectionLossOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(2), neverPing)
	s := idempotency.NewPostgresStore(pool)
	// Open both connections, then end them.
	a, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	b.Release()
	terminateIdle(t, pool)

	_, err = s.Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
	if got := idempotencytest.StoreReason(t, "claim on two dead connections", err); got != idempotency.ReasonConnection {
		t.Fatalf("reason %q, want %q: %v", got, idempotency.ReasonConnection, err)
	}
	idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
}

// TestPostgresClaimRetryWinsItsOwnRow: a claim whose reply is lost after
// the server committed it is run again by the store on a new connection;
// with an owner token the retry recognises the row as its own claim and
// wins it (the request goes on and records its outcome), where without
// one it reads the row as someone else's claim in flight (the behaviour
// before owner tokens: the request answered 409 and the key stayed in
// flight until its lease or TTL ended).
func TestPostgresClaimRetryWinsItsOwnRow(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("WITH ins AS (")} // pgsql.ClaimSQL
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	owned := idempotencytest.Request("u", time.Hour, time.Minute)
	owned.Owner = uuid.New()
	rc.cuts.Store(1)
	res, err := s.Claim(ctx, owned)
	if err != nil || !res.Won {
		t.Fatalf("Claim whose first reply was lost: won %v, %v; want won", res.Won, err)
	}
	if n := rc.cut.Load(); n != 1 {
		t.Fatalf("%d replies cut, want 1", n)
	}
	if res.Record.Attempt != 1 || res.Record.Status != idempotency.StatusInFlight || res.Record.LeaseOver {
		t.Errorf("won record: attempt %d status %q lease over %v, want 1, in_flight, false", res.Record.Attempt, res.Record.Status, res.Record.LeaseOver)
	}
	if err := s.Complete(ctx, res.Record.Fence(), res.Record, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete by the retried claim: %v", err)
	}

	anonymous := idempotencytest.Request("u", time.Hour, time.Minute)
	rc.cuts.Store(1)
	res, err = s.Claim(ctx, anonymous)
	if err != nil || res.Won || res.Record.Status != idempotency.StatusInFlight {
		t.Fatalf("Claim without a token whose first reply was lost: won %v status %q, %v; want its own row read as in flight by another",
			res.Won, res.Record.Status, err)
	}
	if n := rc.cut.Load(); n != 2 {
		t.Fatalf("%d replies cut, want 2", n)
	}
}

// TestPostgresReleaseOwnerFreesAnUnknownClaim: a claim that failed with
// both replies lost (its outcome unknown to the caller, although it
// committed) leaves the key in flight; ReleaseOwner with the claim's token,
// what the middleware calls when the handler never ran, frees it, and the
// next request claims the key as new.
func TestPostgresReleaseOwnerFreesAnUnknownClaim(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("WITH ins AS (")} // pgsql.ClaimSQL
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	req := idempotencytest.Request("u", time.Hour, time.Minute)
	req.Owner = uuid.New()
	rc.cuts.Store(2)
	_, err := s.Claim(ctx, req)
	if got := idempotencytest.StoreReason(t, "claim with both replies lost", err); got != idempotency.ReasonConnection {
		t.Fatalf("reason %q, want %q: %v", got, idempotency.ReasonConnection, err)
	}
	next := req
	next.Owner = uuid.New()
	if res, err := s.Claim(ctx, next); err != nil || res.Won || res.Record.Status != idempotency.StatusInFlight {
		t.Fatalf("the key after the unknown claim: won %v status %q, %v; want in flight", res.Won, res.Record.Status, err)
	}
	released, err := s.ReleaseOwner(ctx, req)
	if err != nil || !released {
		t.Fatalf("ReleaseOwner: %v, %v; want true", released, err)
	}
	res, err := s.Claim(ctx, next)
	if err != nil || !res.Won || res.Record.Attempt != 1 {
		t.Fatalf("Claim after ReleaseOwner: won %v attempt %d, %v; want a new claim", res.Won, res.Record.Attempt, err)
	}
}

// TestPostgresTakeoverLostReplyThenOwnClaimWins: a takeover whose reply is
// lost after it committed reads as lost on the store's retry (its fence
// no longer matches); the request's next Claim with the same owner token,
// which the middleware makes after a lost takeover, wins the row the
// takeover made, so the request still runs once, as the owner.
func TestPostgresTakeoverLostReplyThenOwnClaimWins(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("WITH taken AS (")} // pgsql.TakeoverSQL
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	first := idempotencytest.Request("u", time.Millisecond, time.Millisecond)
	rec := idempotencytest.MustClaim(t, s, first)
	if err := s.Complete(ctx, rec.Fence(), rec, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatal(err)
	}
	expired := idempotencytest.WaitFor(t, s, first, "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

	second := first
	second.TTL, second.Lease, second.Owner = time.Hour, time.Minute, uuid.New()
	rc.cuts.Store(1)
	res, err := s.Takeover(ctx, expired.Fence(), second)
	if err != nil || res.Won {
		t.Fatalf("Takeover whose reply was lost: won %v, %v; want a loss (its retry's fence no longer matches)", res.Won, err)
	}
	if n := rc.cut.Load(); n != 1 {
		t.Fatalf("%d replies cut, want 1", n)
	}
	res, err = s.Claim(ctx, second)
	if err != nil || !res.Won || res.Record.Attempt != expired.Attempt+1 {
		t.Fatalf("Claim with the takeover's token: won %v attempt %d, %v; want won, attempt %d", res.Won, res.Record.Attempt, err, expired.Attempt+1)
	}
	if err := s.Complete(ctx, res.Record.Fence(), res.Record, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete by the takeover's owner: %v", err)
	}
}

// TestPgBouncerStore runs the store's behaviour suite through PgBouncer in
// transaction mode, with default_query_exec_mode=exec.
func TestPgBouncerStore(t *testing.T) {
	t.Parallel()
	testdb.RequirePgBouncer(t)
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return idempotency.NewPostgresStore(testdb.NewPgBouncer(t))
	})
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
	cfg.Enabled = func(context.Context) bool { return true }
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
