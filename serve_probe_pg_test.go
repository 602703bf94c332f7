package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// proxiedPool is a pool on a schema of its own, reached through a
// tcpproxy, configured further by configure.
func proxiedPool(t *testing.T, configure func(*pgxpool.Config)) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	cfg := testdb.New(t).Config()
	proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	pool := testdb.New(t, testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.Host = host
		fmt.Sscan(port, &c.ConnConfig.Port)
		c.ConnConfig.Fallbacks = nil
		c.ConnConfig.ConnectTimeout = time.Second
		if configure != nil {
			configure(c)
		}
	}))
	return pool, proxy
}

// burst sends n requests with new keys to h at once and returns their
// statuses, failing the test by name if they are not all answered within
// bound.
func burst(t *testing.T, h http.Handler, n int, bound time.Duration) []int {
	t.Helper()
	codes := make([]int, n)
	within(t, bound, "the burst", func() {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i] = sendAs(h, uuid.NewString(), "u1").Code
			}()
		}
		wg.Wait()
	})
	return codes
}

// within runs f, failing the test by its name and what if f has not
// returned after bound (f is then left running).
func within(t *testing.T, bound time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%s: %s did not finish within %v", t.Name(), what, bound)
	}
}

// TestPostgresBypassNeedsAFailedProbe: with the link cut (new connections
// refused, open ones cut), the fail-open route's claim fails, its outage
// probe fails too, and it bypasses within two store timeouts and a margin
// (DESIGN-settled-r4 item 4).
func TestPostgresBypassNeedsAFailedProbe(t *testing.T) {
	t.Parallel()
	const storeTimeout = 300 * time.Millisecond
	pool, proxy := proxiedPool(t, nil)
	c := newClassRoutes(t, pool, storeTimeout)
	proxy.Cut()
	key := uuid.NewString()
	start := time.Now()
	var w *httptest.ResponseRecorder
	within(t, 20*storeTimeout, "the fail-open request", func() { w = sendAs(c.billing, key, "u1") })
	took := time.Since(start)
	if w.Code != http.StatusCreated || c.billed.Load() != 1 {
		t.Fatalf("fail-open route with the link cut: %d %s, runs %d; want the bypass", w.Code, w.Body, c.billed.Load())
	}
	if bound := 2*storeTimeout + 5*storeTimeout; took > bound {
		t.Errorf("the bypass came after %v, want within two store timeouts and a margin (%v)", took, bound)
	}
	if n := gathered(t, c.reg, "idempotency_store_errors_total", "probe", idempotency.ReasonConnection); n != 1 {
		t.Errorf("store errors {probe, connection} = %v, want 1", n)
	}
}

// TestPostgresProbeVerdictShared: N fail-open requests whose claims fail
// at once (their statements sent into a black hole) share one probe: the
// proxy sees exactly one new connection, the probe's, and every request
// bypasses once it failed.
func TestPostgresProbeVerdictShared(t *testing.T) {
	t.Parallel()
	const n, storeTimeout = 8, time.Second // a second: on a loaded machine the claims' deadlines must still fall inside one probe and its verdict
	var connects atomic.Int64              // every new connection resolves its host once; a cancel request does not
	pool, proxy := proxiedPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
			connects.Add(1)
			return net.DefaultResolver.LookupHost(ctx, host)
		}
		c.MaxConns, c.MinConns = n, 0
		// The claims must go out on the warm connections, not ping them
		// first and dial new ones: the probe's dial is the one counted.
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	c := newClassRoutes(t, pool, storeTimeout)
	warm := make([]*pgxpool.Conn, n)
	for i := range warm {
		conn, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		warm[i] = conn
	}
	for _, conn := range warm {
		conn.Release()
	}
	before, connectsBefore := proxy.Accepted(), connects.Load()
	proxy.Blackhole()
	start := time.Now()
	codes := burst(t, c.billing, n, 20*storeTimeout)
	took := time.Since(start)
	for i, code := range codes {
		if code != http.StatusCreated {
			t.Errorf("request %d: %d, want the bypass", i, code)
		}
	}
	if dials := connects.Load() - connectsBefore; dials != 1 {
		t.Errorf("%d new connections during the outage, want 1 (one probe for every failed claim)", dials)
	}
	// Through the proxy: the probe's dial and the cancel request pgx sends
	// for each claim its deadline interrupted (they need no lookup).
	if dials := proxy.Accepted() - before; dials < 1 || dials > n+1 {
		t.Errorf("%d dials through the proxy during the outage, want the probe's and at most one cancel request per claim (%d)", dials, n+1)
	}
	if t.Failed() {
		t.Logf("logs:\n%s", c.logs)
	}
	if got := gathered(t, c.reg, "idempotency_bypasses_total", "billing", "store_unavailable"); got != n {
		t.Errorf("bypasses = %v, want %d", got, n)
	}
	if bound := 2*storeTimeout + 5*storeTimeout; took > bound {
		t.Errorf("the burst's answers took %v, want within two store timeouts and a margin (%v)", took, bound)
	}
}

// TestPostgresPoolOpeningIsNoOutage: a burst under a short store timeout
// while the pool is still opening its connections, on a healthy
// database (the connects are held until the burst is answered), is 503
// pool_exhausted on the fail-open route: no bypass, no probe, no run
// (DESIGN-settled-r4 item 4, reversing r3 item 2). Once the connects
// finish, the route serves again.
func TestPostgresPoolOpeningIsNoOutage(t *testing.T) {
	t.Parallel()
	const n, storeTimeout = 12, 200 * time.Millisecond
	gate := make(chan struct{})
	var hold atomic.Bool // set once the schema is migrated
	pool := testdb.New(t, testdb.MaxConns(4), testdb.Configure(func(c *pgxpool.Config) {
		c.MinConns = 0
		c.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
			if !hold.Load() {
				return nil
			}
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}))
	hold.Store(true)
	pool.Reset() // the connections opened so far go: every claim needs a connect
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	c := newClassRoutes(t, pool, storeTimeout)
	codes := burst(t, c.billing, n, 20*storeTimeout)
	open()
	for i, code := range codes {
		if code != http.StatusServiceUnavailable {
			t.Errorf("request %d while the pool was opening: %d, want 503", i, code)
		}
	}
	if c.billed.Load() != 0 {
		t.Errorf("the handler ran %d times", c.billed.Load())
	}
	if got := gathered(t, c.reg, "idempotency_bypasses_total", "billing", "store_unavailable"); got != 0 {
		t.Errorf("bypasses = %v, want 0", got)
	}
	if got := gathered(t, c.reg, "idempotency_store_errors_total", "claim", idempotency.ReasonPoolExhausted); got != n {
		t.Errorf("store errors {claim, pool_exhausted} = %v, want %d", got, n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil { // the connects, let go, finish in the background
		if w := sendAs(c.billing, uuid.NewString(), "u1"); w.Code == http.StatusCreated {
			return
		}
	}
	t.Fatal("TestPostgresPoolOpeningIsNoOutage: the route did not serve within 10s of the connects finishing")
}

// TestPostgresStatementTimeoutIsNoOutage: a claim the server cancels at
// the session's statement_timeout (SQLSTATE 57014), here behind a table
// lock, is statement_timeout: 503 on the fail-open route, no probe.
func TestPostgresStatementTimeoutIsNoOutage(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = "100"
	}))
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context())) //nolint:errcheck
	if _, err := tx.Exec(t.Context(), `LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = idempotency.NewPostgresStore(pool).Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
	if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonStatementTimeout {
		t.Fatalf("a claim cancelled by statement_timeout: %q (%v), want statement_timeout", r, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("a claim cancelled by statement_timeout: %v carries no server error", err)
	}
}

// TestPostgresProbeThroughPgBouncer: through PgBouncer (which answers
// logins itself) the probe's SELECT 1 reaches the database: nil while it
// is up; with the link from PgBouncer to PostgreSQL cut, PgBouncer's own
// class-08 error (query_wait_timeout, 08P01) is a failed probe.
func TestPostgresProbeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	cfg := testdb.New(t).Config()
	proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	var p uint16
	fmt.Sscan(port, &p)
	bouncer := testdb.PgBouncerTo(t, host, p)
	pcfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&connect_timeout=5",
		cfg.ConnConfig.User, bouncer, cfg.ConnConfig.Database))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := idempotency.NewPostgresStore(pool)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe through PgBouncer with the database up: %v, want nil", err)
	}
	proxy.Cut()
	// A fresh store: the first store's verdict stands for a second.
	s = idempotency.NewPostgresStore(pool)
	err = s.Probe(ctx)
	if r := idempotencytest.StoreReason(t, "Probe", err); r != idempotency.ReasonConnection {
		t.Fatalf("Probe through PgBouncer with the database cut off: %q (%v), want connection", r, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code[:2] != "08" {
		t.Errorf("the failed probe's cause %v, want PgBouncer's class-08 error", err)
	}
}

// TestPostgresProbeRefusedLogin: a probe the server refuses at login
// (class 28) reached a database that answers: reason auth, never a failed
// probe, so a fail-open route does not bypass on a configuration error.
func TestPostgresProbeRefusedLogin(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := idempotency.NewPostgresStore(rolePool(t, pool, testRole(t, pool, "NOLOGIN")))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if r := idempotencytest.StoreReason(t, "Probe", s.Probe(ctx)); r != idempotency.ReasonAuth {
		t.Fatalf("Probe refused at login: %q, want auth", r)
	}
}
