package idempotency

import (
	"context"
	"encoding/json"
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
		cfg.Scope = func(r *http.Request) string { return r.Header.Get("X-User") }
	}
	if cfg.Enabled == nil {
		cfg.Enabled = func(*http.Request) bool { return h.enabled.Load() }
	}
	cfg.OnReplay = func(ctx context.Context, ev ReplayEvent) error {
		if _, ok := ctx.Deadline(); !ok {
			h.t.Error("the replay hook got no deadline")
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.replays = append(h.replays, ev)
		return h.hookErr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mw, err := New(h.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.mw = mw
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
