package idempotency_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The harness of the external-package tests (package idempotency_test):
// routes over a Postgres pool or any Store, requests, races, counters and
// connection cutters. The in-package tests have theirs in harness_test.go;
// they cannot import idempotencytest (an import cycle), these can.

// quiet is a logger that drops everything.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newMiddleware is this package's one middleware builder: New over store
// with cfg, its metrics in a registry of its own, quiet and with the
// kill-switch on unless cfg says otherwise. It fails the test when New
// fails.
func newMiddleware(t testing.TB, store idempotency.Store, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.Enabled == nil {
		cfg.Enabled = func(context.Context) bool { return true }
	}
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// pgRoute builds a middleware over pool and wraps a counting handler.
func pgRoute(t *testing.T, pool *pgxpool.Pool, cfg idempotency.Config, rc idempotency.RouteConfig, calls *atomic.Int64) (http.Handler, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, quiet
	store := idempotency.NewPostgresStore(pool)
	if err := store.Check(t.Context()); err != nil { // as a service does at start-up
		t.Fatal(err)
	}
	return newMiddleware(t, store, cfg).MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"n":%d}`, calls.Load())
	})), reg
}

// doBound bounds every request do sends: many times any store timeout
// these tests set, it only turns a hang (a store call without its
// deadline) into a failure of the test that sent the request, by name.
const doBound = time.Minute

// do sends a POST /orders with key and body through h, bounded by doBound.
func do(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.HeaderKey, key)
	}
	return serveWithin(h, r, doBound)
}

// statusNoAnswer is the status serveWithin gives a request that got no
// answer in time.
const statusNoAnswer = 599

// serveWithin serves r through h and waits at most wait for the answer. A
// request that gets none comes back as statusNoAnswer with a body that
// says so (its handler's goroutine is left behind), so the test that sent
// it fails by name instead of hanging; a panic is re-raised.
func serveWithin(h http.Handler, r *http.Request, wait time.Duration) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		h.ServeHTTP(w, r)
	}()
	select {
	case p := <-done:
		if p != nil {
			panic(p)
		}
		return w
	case <-time.After(wait):
		stuck := httptest.NewRecorder()
		stuck.WriteHeader(statusNoAnswer)
		fmt.Fprintf(stuck, "no answer within %v: a store call without its deadline?", wait)
		return stuck
	}
}

// race sends copies of each key at once through the handlers (round robin)
// and fails on any answer other than a fresh 201, a replay or a 409 in
// flight.
func race(t *testing.T, handlers []http.Handler, keys []string, copies int) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, len(keys)*copies)
	for i := range len(keys) * copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			w := do(handlers[i%len(handlers)], keys[i%len(keys)], `{"qty":1}`)
			if w.Code != 201 && !(w.Code == 409 && strings.Contains(w.Body.String(), "idempotency_in_flight")) {
				errs <- fmt.Sprintf("%d %s", w.Code, w.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("unexpected answer: %s", e)
	}
}

// raceConfig gives 1,280 simultaneous requests on a small pool time to
// queue for a connection: a race must be decided by the claim, not by
// timeouts.
var raceConfig = idempotency.Config{StoreTimeout: 20 * time.Second, Lease: time.Minute}

func newKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	return keys
}

// gathered returns the value of the counter name whose label values are
// labels (sorted by label name, as gathered) in reg, or 0 when no such
// series exists.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != labels[i] {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// slowThenFailingStore answers its first claim late (a loaded pool) and fails
// its first release (the same congestion, one call later).
type slowThenFailingStore struct {
	*idempotency.PostgresStore
	delay    time.Duration
	slowed   atomic.Bool
	released atomic.Int64
}

func (s *slowThenFailingStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.PostgresStore.Claim(ctx, req)
	if s.slowed.CompareAndSwap(false, true) {
		time.Sleep(s.delay) // a slow reply, not synchronisation
	}
	return res, err
}

func (s *slowThenFailingStore) Release(ctx context.Context, f idempotency.Fence) error {
	if s.released.Add(1) == 1 {
		return &idempotency.StoreError{Op: "release", Reason: idempotency.ReasonTimeout, Err: context.DeadlineExceeded}
	}
	return s.PostgresStore.Release(ctx, f)
}

// pgCounter counts the statements pgx runs (a QueryTracer) and the writes
// made on the network connection, each of which starts one round trip.
type pgCounter struct {
	statements atomic.Int64
	writes     atomic.Int64
}

func (c *pgCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

func (c *pgCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *pgCounter) reset() { c.statements.Store(0); c.writes.Store(0) }

// countingConn counts Write calls.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// orphanKeys returns the keys of reqs.
func orphanKeys(reqs []idempotency.ClaimRequest) []string {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	return keys
}

// waitBlockedTree polls pg_stat_activity until n backends wait, directly
// or through each other, for a lock held by blocker's backend (condition
// polling, not a sleep-as-sync).
func waitBlockedTree(t *testing.T, pool *pgxpool.Pool, blocker uint32, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		err := pool.QueryRow(t.Context(), `WITH RECURSIVE blocked(pid) AS (
	SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))
	UNION
	SELECT a.pid FROM pg_stat_activity a JOIN blocked b ON b.pid = ANY(pg_blocking_pids(a.pid))
) SELECT count(*) FROM blocked`, int32(blocker)).Scan(&got)
		if err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backend(s) waited for the blocker's lock, want %d", got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// neverPing stops pgxpool from pinging a connection idle for over a second
// before handing it out: under load no connection idles that long, so a
// connection the server ended is handed out as it is, as here.
var neverPing = testdb.Configure(func(c *pgxpool.Config) {
	c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
})

// terminateIdle ends, from the server side (what an administrator, a
// restart or a failover does), every connection pool holds, all idle, and
// waits until each backend has gone.
func terminateIdle(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conns := pool.AcquireAllIdle(t.Context())
	if len(conns) == 0 {
		t.Fatal("the pool holds no idle connection")
	}
	admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	for _, c := range conns {
		pid := c.Conn().PgConn().PID()
		c.Release()
		var ended bool
		if err := admin.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&ended); err != nil || !ended {
			t.Fatalf("terminate backend %d: %v %v", pid, ended, err)
		}
	}
}

// replyCutter loses the server's whole reply to chosen statements: a
// connection that sent a statement holding marker reads that statement's
// reply up to its ReadyForQuery (so the server has run and committed it),
// drops it and fails as a lost connection would. It cuts the first cuts
// such statements, over every connection of the pool.
type replyCutter struct {
	marker []byte
	cuts   atomic.Int32 // replies still to cut
	cut    atomic.Int32 // replies cut so far
}

// option configures a test pool to dial through rc, in the exec query mode
// (each statement is one write holding its SQL text and one reply).
func (rc *replyCutter) option() testdb.Option {
	return testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &cutConn{Conn: conn, rc: rc}, nil
		}
	})
}

// cutConn is one connection dialled through a replyCutter.
type cutConn struct {
	net.Conn
	rc    *replyCutter
	armed atomic.Bool // a statement to cut was sent: its reply is lost
}

func (c *cutConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.rc.marker) && c.rc.cuts.Add(-1) >= 0 {
		c.armed.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	if !c.armed.CompareAndSwap(true, false) {
		return c.Conn.Read(b)
	}
	readReply(c.Conn)
	c.rc.cut.Add(1)
	c.Conn.Close()
	return 0, io.ErrUnexpectedEOF
}

// readReply reads from conn the server's reply up to its ReadyForQuery
// (or the read's error): the statement has run and its transaction ended.
func readReply(conn net.Conn) []byte {
	var reply []byte
	chunk := make([]byte, 4096)
	for !readyForQuery(reply) {
		n, err := conn.Read(chunk)
		reply = append(reply, chunk[:n]...)
		if err != nil {
			break
		}
	}
	return reply
}

// readyForQuery reports whether the backend messages in b include a
// ReadyForQuery ('Z'): the server has finished the statement and its
// implicit transaction.
func readyForQuery(b []byte) bool {
	for len(b) >= 5 {
		n := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < n {
			return false
		}
		if b[0] == 'Z' {
			return true
		}
		b = b[n:]
	}
	return false
}

// fidelityRoute wraps hf in a route named name over store.
func fidelityRoute(t *testing.T, store idempotency.Store, name string, hf http.HandlerFunc) http.Handler {
	t.Helper()
	return newMiddleware(t, store, idempotency.Config{}).MustRoute(idempotency.RouteConfig{Name: name})(hf)
}

type fidelityResp struct {
	status  int
	header  http.Header
	trailer http.Header
	body    string
}

// fidelitySend sends one keyed POST over a real connection and returns what
// the client saw.
func fidelitySend(t *testing.T, srv *httptest.Server, key string) fidelityResp {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/r", strings.NewReader(`{}`))
	req.Header.Set(idempotency.HeaderKey, key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return fidelityResp{resp.StatusCode, resp.Header, resp.Trailer, string(b)}
}

// forStores runs f as a subtest over a memory store and a Postgres one.
func forStores(t *testing.T, f func(t *testing.T, store idempotency.Store)) {
	t.Run("Memory", func(t *testing.T) { t.Parallel(); f(t, idempotency.NewMemoryStore()) })
	t.Run("Postgres", func(t *testing.T) { t.Parallel(); f(t, idempotency.NewPostgresStore(testdb.New(t))) })
}

// signalHandler is a slog handler that closes seen when a record whose
// message contains want is logged.
type signalHandler struct {
	slog.Handler
	want string
	seen chan struct{}
	once atomic.Bool
}

func (h *signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.want) && h.once.CompareAndSwap(false, true) {
		close(h.seen)
	}
	return nil
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }

// orderRoute wraps a counting 201 handler over pool, logging to log.
func orderRoute(t *testing.T, s idempotency.Store, log *slog.Logger, calls *atomic.Int64) http.Handler {
	t.Helper()
	return newMiddleware(t, s, idempotency.Config{Logger: log}).MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
}
