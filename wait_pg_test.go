package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The duplicates that wait (RouteConfig.WaitInFlight) on the pgx store:
// woken by the listener, answered by polling when it cannot hear, and
// holding no pooled connection while they wait.

// pgWaitBound bounds what must not hang in these tests.
const pgWaitBound = 20 * time.Second

// waitStore is a PostgresStore over pool logging to log, closed (its
// listener) when the test ends, before the pool.
func waitStore(t *testing.T, pool *pgxpool.Pool, log *slog.Logger) *idempotency.PostgresStore {
	t.Helper()
	if log == nil {
		log = quiet
	}
	s := idempotency.NewPostgresStoreLoggingForTest(pool, log)
	t.Cleanup(s.Close)
	return s
}

// gate holds an owner's handler until opened.
type gate struct {
	entered chan struct{}
	hold    chan struct{}
	status  int
	once    sync.Once
}

func newGate(status int) *gate {
	return &gate{entered: make(chan struct{}), hold: make(chan struct{}), status: status}
}

func (g *gate) open() { g.once.Do(func() { close(g.hold) }) }

type gateKey struct{}

// gatedRoute wraps a counting handler under rc over s: a request carrying
// a gate waits for it, the others answer 201 at once.
func gatedRoute(t *testing.T, s idempotency.Store, cfg idempotency.Config, rc idempotency.RouteConfig, calls *atomic.Int64) http.Handler {
	t.Helper()
	return newMiddleware(t, s, cfg).MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if g, ok := r.Context().Value(gateKey{}).(*gate); ok {
			close(g.entered)
			<-g.hold
			if g.status != http.StatusCreated {
				w.WriteHeader(g.status)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":1}`)
	}))
}

// startOwner sends key through h held by g, and returns once its handler
// runs; the answer comes on the channel.
func startOwner(t *testing.T, h http.Handler, key string, g *gate) <-chan *httptest.ResponseRecorder {
	t.Helper()
	out := make(chan *httptest.ResponseRecorder, 1)
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, key)
	r = r.WithContext(context.WithValue(r.Context(), gateKey{}, g))
	go func() { out <- serveWithin(h, r, doBound) }()
	select {
	case <-g.entered:
	case <-time.After(pgWaitBound):
		t.Fatal("the owner's handler never ran")
	}
	return out
}

// sendCopies sends n copies of key through h at once; their answers come
// on the channel once all came.
func sendCopies(h http.Handler, key string, n int) <-chan []*httptest.ResponseRecorder {
	out := make(chan []*httptest.ResponseRecorder, 1)
	go func() {
		ws := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		for i := range ws {
			wg.Go(func() { ws[i] = do(h, key, `{}`) })
		}
		wg.Wait()
		out <- ws
	}()
	return out
}

// awaitCount returns once count() reaches n, failing after pgWaitBound.
func awaitCount(t *testing.T, what string, count func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(pgWaitBound)
	for count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s, want %d", count(), what, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitListener returns once s's listener passed its self-check.
func awaitListener(t *testing.T, s *idempotency.PostgresStore) {
	t.Helper()
	awaitCount(t, "listener self-checks", func() int { heard, _ := idempotency.ListenerForTest(s); return int(heard) }, 1)
}

func isReplay(w *httptest.ResponseRecorder) bool {
	return w.Code == http.StatusCreated && w.Header().Get(idempotency.HeaderReplayed) == "true"
}

func TestWaitInFlightStormPostgres(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(16))
	s := waitStore(t, pool, nil)
	var calls atomic.Int64
	// A store timeout that a burst of 128 claims on a busy 2-core machine
	// never reaches: the storm is about the wait, not saturation.
	h := newMiddleware(t, s, idempotency.Config{StoreTimeout: 5 * time.Second}).MustRoute(idempotency.RouteConfig{Name: "orders", WaitInFlight: time.Second})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			time.Sleep(200 * time.Millisecond) // the handler's work, not a synchronisation
			w.WriteHeader(http.StatusCreated)
		}))
	const keys, copies = 4, 32
	var fresh, replays, inFlight, other atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range keys {
		key := uuid.NewString()
		for range copies {
			wg.Go(func() {
				<-start
				w := do(h, key, `{}`)
				switch {
				case isReplay(w):
					replays.Add(1)
				case w.Code == http.StatusCreated:
					fresh.Add(1)
				case w.Code == http.StatusConflict && strings.Contains(w.Body.String(), "idempotency_in_flight"):
					inFlight.Add(1)
				default:
					other.Add(1)
					t.Errorf("%d %s", w.Code, w.Body)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	t.Logf("storm on PostgreSQL (%d keys x %d copies, 200 ms handler, 1 s wait): %d executions, %d fresh, %d replays, %d in flight, %d other",
		keys, copies, calls.Load(), fresh.Load(), replays.Load(), inFlight.Load(), other.Load())
	if calls.Load() != keys || fresh.Load() != keys {
		t.Errorf("%d executions, %d fresh answers; want one per key", calls.Load(), fresh.Load())
	}
	if replays.Load() != keys*(copies-1) || inFlight.Load() != 0 {
		t.Errorf("%d replays, %d in flight; want every duplicate (%d) replayed", replays.Load(), inFlight.Load(), keys*(copies-1))
	}
}

func TestWaitInFlightHoldsNoPooledConnection(t *testing.T) {
	t.Parallel()
	const waiters = 16
	pool := testdb.New(t, testdb.MaxConns(waiters+4)) // room for every waiter to hold one, were it to
	s := waitStore(t, pool, nil)
	var calls atomic.Int64
	h := gatedRoute(t, s, idempotency.Config{}, idempotency.RouteConfig{Name: "orders", WaitInFlight: 25 * time.Second}, &calls)
	key := uuid.NewString()
	g := newGate(http.StatusCreated)
	defer g.open()
	owner := startOwner(t, h, key, g)
	dups := sendCopies(h, key, waiters)
	awaitCount(t, "waiters", func() int { return idempotency.WaitersForTest(s) }, waiters)
	// Sample the pool through ten polls of every waiter. Waiters that held
	// a connection would show in every sample; re-reads show in some.
	samples := make([]int32, 100)
	for i := range samples {
		samples[i] = pool.Stat().AcquiredConns()
		time.Sleep(10 * time.Millisecond) // the sampling period
	}
	if n := idempotency.WaitersForTest(s); n != waiters {
		t.Fatalf("%d waiters at the end of the sampling, want %d still waiting", n, waiters)
	}
	slices.Sort(samples)
	median, top := samples[len(samples)/2], samples[len(samples)-1]
	t.Logf("%d waiters: pooled connections acquired while they waited: median %d, max %d (of %d samples)", waiters, median, top, len(samples))
	if median > waiters/4 {
		t.Errorf("a median of %d pooled connections acquired while %d duplicates waited: waiters must hold none between their reads", median, waiters)
	}
	g.open()
	if w := <-owner; w.Code != http.StatusCreated {
		t.Fatalf("owner: %d", w.Code)
	}
	for _, w := range <-dups {
		if !isReplay(w) {
			t.Errorf("duplicate: %d %s, want the replay", w.Code, w.Body)
		}
	}
}

func TestWaitInFlightOutcomesPostgres(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := waitStore(t, pool, nil)
	t.Run("owner fails", func(t *testing.T) {
		var calls atomic.Int64
		h := gatedRoute(t, s, idempotency.Config{}, idempotency.RouteConfig{Name: "fails", WaitInFlight: 25 * time.Second}, &calls)
		key := uuid.NewString()
		g := newGate(http.StatusBadGateway)
		owner := startOwner(t, h, key, g)
		dups := sendCopies(h, key, 4)
		awaitCount(t, "waiters", func() int { return idempotency.WaitersForTest(s) }, 4)
		g.open()
		<-owner
		for _, w := range <-dups {
			if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
				t.Errorf("duplicate: %d %s, want 409 idempotency_previous_failed", w.Code, w.Body)
			}
		}
		if calls.Load() != 1 {
			t.Errorf("%d executions, want 1", calls.Load())
		}
	})
	t.Run("owner slower than the wait", func(t *testing.T) {
		var calls atomic.Int64
		const wait = 300 * time.Millisecond
		h := gatedRoute(t, s, idempotency.Config{}, idempotency.RouteConfig{Name: "slow", WaitInFlight: wait}, &calls)
		key := uuid.NewString()
		g := newGate(http.StatusCreated)
		owner := startOwner(t, h, key, g)
		start := time.Now()
		w := do(h, key, `{}`)
		took := time.Since(start)
		g.open()
		<-owner
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
			t.Errorf("duplicate: %d %s, want 409 idempotency_in_flight", w.Code, w.Body)
		}
		if took < wait || took > pgWaitBound {
			t.Errorf("answered after %v: want after the wait (%v) ran out", took, wait)
		}
	})
}

// wakeCounter counts the wake-ups (pgsql.WakeSQL) a pool's connections send.
type wakeCounter struct{ n atomic.Int64 }

func (c *wakeCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "synchronous_commit = off; SELECT pg_notify") {
		c.n.Add(1)
	}
	return ctx
}

func (c *wakeCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestWaitInFlightRecordWakesByNotify: a record on a route with
// WaitInFlight sends one wake-up after it committed, which another
// store's listener hears (no poll involved: the raw Watch channel); a
// route without WaitInFlight sends none.
func TestWaitInFlightRecordWakesByNotify(t *testing.T) {
	t.Parallel()
	wakes := &wakeCounter{}
	pool := testdb.New(t, testdb.Tracer(wakes))
	listening := waitStore(t, testdb.New(t), nil)     // another process's store: NOTIFY is per database
	_, stop := idempotency.WatchForTest(listening, 0) // starts its listener
	stop()
	awaitListener(t, listening)

	var calls atomic.Int64
	waiting := gatedRoute(t, waitStore(t, pool, nil), idempotency.Config{}, idempotency.RouteConfig{Name: "waiting", WaitInFlight: time.Second}, &calls)
	plain := gatedRoute(t, waitStore(t, pool, nil), idempotency.Config{}, idempotency.RouteConfig{Name: "plain"}, &calls)
	if w := do(plain, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
		t.Fatalf("plain: %d", w.Code)
	}
	if n := wakes.n.Load(); n != 0 {
		t.Errorf("a route without WaitInFlight sent %d wake-ups, want none", n)
	}

	key := uuid.NewString()
	g := newGate(http.StatusCreated)
	defer g.open()
	done := startOwner(t, waiting, key, g)
	var id int64
	if err := pool.QueryRow(t.Context(), `SELECT id FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	wake, stop := idempotency.WatchForTest(listening, id)
	defer stop()
	g.open()
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("waiting: %d", w.Code)
	}
	if n := wakes.n.Load(); n != 1 {
		t.Errorf("a record on a route with WaitInFlight sent %d wake-ups, want 1", n)
	}
	select {
	case <-wake:
	case <-time.After(pgWaitBound):
		t.Fatal("the listener never heard the record's wake-up")
	}
}

// TestWaitInFlightListenerCannotHear: a listener whose self-check fails
// (through PgBouncer in transaction mode, or unable to connect) logs a
// WARN, and the waiters are answered by polling.
func TestWaitInFlightListenerCannotHear(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"through PgBouncer in transaction mode", func(t *testing.T) string {
			testdb.RequirePgBouncer(t)
			pooled, _ := testdb.NewPgBouncerDSN(t)
			return pooled
		}},
		{"unreachable", func(t *testing.T) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close() // nobody listens there now
			return "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=2"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			warned := &signalHandler{want: "the wait listener does not hear", seen: make(chan struct{})}
			s := waitStore(t, pool, slog.New(warned))
			idempotency.ShortListenCheckForTest(s, time.Second)
			if err := s.ListenURL(tc.url(t)); err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			h := gatedRoute(t, s, idempotency.Config{}, idempotency.RouteConfig{Name: "orders", WaitInFlight: 25 * time.Second}, &calls)
			key := uuid.NewString()
			g := newGate(http.StatusCreated)
			owner := startOwner(t, h, key, g)
			dups := sendCopies(h, key, 4)
			select {
			case <-warned.seen:
			case <-time.After(pgWaitBound):
				t.Fatal("no WARN from a listener that cannot hear")
			}
			g.open()
			<-owner
			select {
			case ws := <-dups:
				for _, w := range ws {
					if !isReplay(w) {
						t.Errorf("duplicate: %d %s, want the replay", w.Code, w.Body)
					}
				}
			case <-time.After(pgWaitBound):
				t.Fatal("the duplicates were not answered by polling")
			}
			if heard, _ := idempotency.ListenerForTest(s); heard != 0 {
				t.Errorf("the listener passed %d self-checks, want none", heard)
			}
		})
	}
}

func TestWaitInFlightBadListenURL(t *testing.T) {
	t.Parallel()
	s := idempotency.NewPostgresStore(testdb.New(t))
	defer s.Close()
	if err := s.ListenURL("postgres://%zz"); err == nil || !strings.Contains(err.Error(), "ListenURL") {
		t.Errorf("ListenURL of an invalid URL = %v, want an error naming ListenURL", err)
	}
}

// TestWaitInFlightLostWakeUpCostsAPoll: an outcome whose wake-up never
// comes (its route sends none) reaches the waiters by their poll.
func TestWaitInFlightLostWakeUpCostsAPoll(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := waitStore(t, pool, nil)
	_, stop := idempotency.WatchForTest(s, 0)
	stop()
	awaitListener(t, s) // the listener hears: only this outcome's wake-up is missing
	var calls atomic.Int64
	rc := idempotency.RouteConfig{Name: "orders"}
	owner := gatedRoute(t, waitStore(t, pool, nil), idempotency.Config{}, rc, &calls) // no WaitInFlight: no wake-up
	rc.WaitInFlight = 25 * time.Second
	waiting := gatedRoute(t, s, idempotency.Config{}, rc, &calls)
	key := uuid.NewString()
	g := newGate(http.StatusCreated)
	done := startOwner(t, owner, key, g)
	dups := sendCopies(waiting, key, 4)
	awaitCount(t, "waiters", func() int { return idempotency.WaitersForTest(s) }, 4)
	g.open()
	<-done
	recorded := time.Now()
	ws := <-dups
	// A generous bound on one poll (100 ms), far below the 25 s wait.
	if took := time.Since(recorded); took > 2*time.Second {
		t.Errorf("answered %v after the record, want within about one poll", took)
	}
	for _, w := range ws {
		if !isReplay(w) {
			t.Errorf("duplicate: %d %s, want the replay", w.Code, w.Body)
		}
	}
}

// TestWaitInFlightStoreCutWhileWaiting: the link to PostgreSQL cut while
// duplicates wait on a fail-open route (the outage probe fails too) answers
// 409 in flight, never a bypass.
func TestWaitInFlightStoreCutWhileWaiting(t *testing.T) {
	t.Parallel()
	base := testdb.New(t)
	proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", base.Config().ConnConfig.Host, base.Config().ConnConfig.Port))
	cfg := base.Config().Copy()
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { proxy.Close(); pool.Close() }()
	s := idempotency.NewPostgresStoreLoggingForTest(pool, quiet)
	defer s.Close()
	// A live connection for each waiter's claim: connecting through the
	// proxy under load must not be what fails them.
	held := make([]*pgxpool.Conn, 4)
	for i := range held {
		if held[i], err = pool.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range held {
		c.Release()
	}

	rc := idempotency.RouteConfig{Name: "billing", FailOpen: true, WaitInFlight: 25 * time.Second}
	mwCfg := idempotency.Config{StoreTimeout: time.Second, Lease: 30 * time.Second}
	var ownerCalls, waiterCalls atomic.Int64
	owner := gatedRoute(t, waitStore(t, base, nil), mwCfg, rc, &ownerCalls)
	waiting := gatedRoute(t, s, mwCfg, rc, &waiterCalls)
	key := uuid.NewString()
	g := newGate(http.StatusCreated)
	defer g.open()
	done := startOwner(t, owner, key, g)
	dups := sendCopies(waiting, key, 4)
	awaitCount(t, "waiters", func() int { return idempotency.WaitersForTest(s) }, 4)
	start := time.Now()
	proxy.Cut()
	select {
	case ws := <-dups:
		for _, w := range ws {
			if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
				t.Errorf("duplicate: %d %s, want 409 idempotency_in_flight", w.Code, w.Body)
			}
		}
	case <-time.After(pgWaitBound):
		t.Fatal("the waiting duplicates were not answered")
	}
	if took := time.Since(start); took > 10*mwCfg.StoreTimeout+time.Second {
		t.Errorf("answered %v after the cut", took)
	}
	if n := waiterCalls.Load(); n != 0 {
		t.Errorf("%d handlers ran on the waiting route: a store error while waiting must never bypass", n)
	}
	g.open()
	<-done
}
