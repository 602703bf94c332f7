package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The harness of the in-package tests (package idempotency): a memory
// store on a fake clock, a route builder, requests and assertions, and the
// test doubles of the Store (hooked, counting, failing, slow). The
// external-package tests, Postgres ones among them, have theirs in
// harness_pg_test.go.

const (
	testKey  = "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b"
	testKey2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
)

// fakeClock drives the memory store's notion of now, so lease and expiry
// rows of the contract are tested without waiting.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// countingStore counts claims around a real MemoryStore and can be made to
// fail or block: the stand-in for the store in tests of the middleware's
// own branching.
type countingStore struct {
	*MemoryStore
	claims atomic.Int64
	fail   atomic.Pointer[error]
	block  atomic.Bool // claims wait for their context to end
	// blocked holds, for the last blocked claim, when it began and the
	// deadline its context carried.
	blocked atomic.Pointer[[2]time.Time]
	probe   atomic.Pointer[error] // the outage probe's verdict; nil: the database answered
	probes  atomic.Int64
}

// Probe returns the verdict set in probe, counting its calls.
func (s *countingStore) Probe(context.Context) error {
	s.probes.Add(1)
	if e := s.probe.Load(); e != nil {
		return *e
	}
	return nil
}

func (s *countingStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	s.claims.Add(1)
	if s.block.Load() {
		d, _ := ctx.Deadline()
		s.blocked.Store(&[2]time.Time{time.Now(), d})
		<-ctx.Done()
		return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonTimeout, Err: ctx.Err()}
	}
	if e := s.fail.Load(); e != nil {
		return ClaimResult{}, *e
	}
	return s.MemoryStore.Claim(ctx, req)
}

// ReleaseOwner fails as Claim does while fail is set: a failing store
// answers no call (else the background release after a timed-out claim
// would log the store as recovered while claims still fail).
func (s *countingStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	if e := s.fail.Load(); e != nil {
		return false, *e
	}
	return s.MemoryStore.ReleaseOwner(ctx, req)
}

type harness struct {
	t       *testing.T
	store   *countingStore
	clock   *fakeClock
	mw      *Middleware
	reg     *prometheus.Registry
	calls   atomic.Int64
	enabled atomic.Bool
	replays []ReplayEvent
	hookErr error // what the replay hook returns
	mu      sync.Mutex
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, clock: &fakeClock{t: time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)}, reg: prometheus.NewRegistry()}
	h.enabled.Store(true)
	ms := NewMemoryStore()
	ms.now = h.clock.Now
	h.store = &countingStore{MemoryStore: ms}
	cfg.Registerer = h.reg
	if cfg.Scope == nil {
		cfg.Scope = func(ctx context.Context) string { r, _ := RequestFromContext(ctx); return r.Header.Get("X-User") }
	}
	if cfg.Enabled == nil {
		cfg.Enabled = func(context.Context) bool { return h.enabled.Load() }
	}
	cfg.OnReplay = func(ctx context.Context, ev ReplayEvent) error {
		if _, ok := ctx.Deadline(); !ok {
			h.t.Error("the replay hook got no deadline")
		}
		if r, ok := RequestFromContext(ctx); !ok || r.Header.Get(HeaderKey) == "" || ev.Adapter != "http" {
			h.t.Errorf("the replay hook's context carries no keyed request (%v), or adapter %q, want http", ok, ev.Adapter)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.replays = append(h.replays, ev)
		return h.hookErr
	}
	h.mw = newHooked(t, h.store, cfg)
	return h
}

// route wraps handler under rc, counting executions.
func (h *harness) route(rc RouteConfig, handler http.HandlerFunc) http.Handler {
	h.t.Helper()
	mw, err := h.mw.Route(rc)
	if err != nil {
		h.t.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		handler(w, r)
	}))
}

// orderHandler answers 201 with a JSON order and a few headers, one of
// which must never be replayed.
func orderHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.Header().Set("X-Order-Trace", "t1")
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":1,"echo":` + string(jsonString(body)) + `}`))
}

func jsonString(b []byte) []byte {
	out, _ := json.Marshal(string(b))
	return out
}

func send(t *testing.T, h http.Handler, method, target, key, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	if key != "" {
		r.Header.Set(HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func assertJSONError(t *testing.T, w *httptest.ResponseRecorder, status int, want string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d (body %s)", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q, want application/json", ct)
	}
	if got := strings.TrimSpace(w.Body.String()); got != want {
		t.Fatalf("body = %s, want %s", got, want)
	}
}

func counter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// hookStore is a MemoryStore whose outcome calls first go through hooks: a
// hook that returns an error stands for a failing store (the call does not
// reach the memory store); one that returns nil lets it through.
type hookStore struct {
	*MemoryStore
	claim                   func(ctx context.Context, req ClaimRequest) error
	complete, fail, release func(ctx context.Context, try int) error
	completes, fails, rels  atomic.Int64
}

func (s *hookStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if s.claim != nil {
		if err := s.claim(ctx, req); err != nil {
			return ClaimResult{}, err
		}
	}
	return s.MemoryStore.Claim(ctx, req)
}

func (s *hookStore) Complete(ctx context.Context, f Fence, owner Record, resp Response) error {
	if err := hook(s.complete, ctx, &s.completes); err != nil {
		return err
	}
	return s.MemoryStore.Complete(ctx, f, owner, resp)
}

func (s *hookStore) Fail(ctx context.Context, f Fence) error {
	if err := hook(s.fail, ctx, &s.fails); err != nil {
		return err
	}
	return s.MemoryStore.Fail(ctx, f)
}

func (s *hookStore) Release(ctx context.Context, f Fence) error {
	if err := hook(s.release, ctx, &s.rels); err != nil {
		return err
	}
	return s.MemoryStore.Release(ctx, f)
}

func hook(h func(context.Context, int) error, ctx context.Context, n *atomic.Int64) error {
	try := int(n.Add(1))
	if h == nil {
		return nil
	}
	return h(ctx, try)
}

// newHooked is this package's one middleware builder: New over s with cfg,
// quiet, its metrics in a registry of its own and the kill-switch on,
// unless cfg says otherwise. It fails the test when New fails.
func newHooked(t *testing.T, s Store, cfg Config) *Middleware {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Enabled == nil {
		cfg.Enabled = func(context.Context) bool { return true }
	}
	mw, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// spyWriter is a ResponseWriter that records whether anything has been sent
// through it (status, body or flush).
type spyWriter struct {
	*httptest.ResponseRecorder
	sent atomic.Bool
}

func (s *spyWriter) WriteHeader(code int) { s.sent.Store(true); s.ResponseRecorder.WriteHeader(code) }

func (s *spyWriter) Write(p []byte) (int, error) {
	s.sent.Store(true)
	return s.ResponseRecorder.Write(p)
}

func (s *spyWriter) Flush() { s.sent.Store(true); s.ResponseRecorder.Flush() }

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// dataErrorStore refuses values: the claim when claims is set, else every
// Complete, counting the calls.
type dataErrorStore struct {
	*MemoryStore
	claims    bool
	completes atomic.Int64
}

func (s *dataErrorStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if s.claims {
		return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonData, Err: errors.New("invalid byte sequence")}
	}
	return s.MemoryStore.Claim(ctx, req)
}

func (s *dataErrorStore) Complete(context.Context, Fence, Record, Response) error {
	s.completes.Add(1)
	return &StoreError{Op: "complete", Reason: ReasonData, Err: errors.New("value out of range")}
}

// contentionStore loses every claim to contention: with expired set, the
// claim reads an expired row and the takeover fails with the conflict
// reason; otherwise the claim itself does.
type contentionStore struct {
	*MemoryStore
	expired bool
}

var errContention = &StoreError{Op: "claim", Reason: ReasonConflict, Err: errors.New("serialization failures past the retries")}

func (s *contentionStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if !s.expired {
		return ClaimResult{}, errContention
	}
	return ClaimResult{Record: Record{ID: 1, Attempt: 1, Status: StatusCompleted, Expired: true, RequestHash: req.RequestHash}}, nil
}

func (s *contentionStore) Takeover(context.Context, Fence, ClaimRequest) (ClaimResult, error) {
	return ClaimResult{}, errContention
}

// recordFailStore claims normally but cannot record outcomes.
type recordFailStore struct{ *MemoryStore }

func (s recordFailStore) Complete(context.Context, Fence, Record, Response) error {
	return &StoreError{Op: "complete", Reason: ReasonConnection, Err: errors.New("connection reset")}
}

// slowClaimStore answers its first claim after a delay (inside the store
// timeout), as a loaded database might.
type slowClaimStore struct {
	*MemoryStore
	delay  time.Duration
	slowed atomic.Bool
}

func (s *slowClaimStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, req)
	if s.slowed.CompareAndSwap(false, true) {
		time.Sleep(s.delay) // a slow reply, not synchronisation
	}
	return res, err
}

// countedRoute wraps a handler that counts its runs and answers 201 in a
// route of a middleware over s (newHooked's configuration).
func countedRoute(t *testing.T, s Store, rc RouteConfig) (*Middleware, http.Handler, *atomic.Int64) {
	t.Helper()
	mw := newHooked(t, s, Config{})
	calls := new(atomic.Int64)
	return mw, mw.MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	})), calls
}
