package idempotency

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
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

// TestContract walks the HTTP contract table of DESIGN.md, one case per row.
func TestContract(t *testing.T) {
	t.Parallel()
	type tc struct {
		name string
		run  func(t *testing.T, h *harness)
	}
	orders := RouteConfig{Name: "orders", ReplayHeaders: []string{"X-Order-Trace"}}
	cases := []tc{
		{"kill-switch off is a pure pass-through", func(t *testing.T, h *harness) {
			h.enabled.Store(false)
			rt := h.route(RouteConfig{Name: "orders", RequireKey: true}, orderHandler)
			for _, key := range []string{"not-a-uuid", testKey, testKey, ""} {
				w := send(t, rt, "POST", "/orders", key, `{"a":1}`)
				if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
					t.Fatalf("key %q: status %d, replayed %q", key, w.Code, w.Header().Get(HeaderReplayed))
				}
			}
			if h.calls.Load() != 4 || h.store.claims.Load() != 0 {
				t.Fatalf("calls=%d claims=%d, want 4 and 0", h.calls.Load(), h.store.claims.Load())
			}
			if got := counter(t, h.mw.metrics.bypasses.WithLabelValues("orders", "disabled")); got != 4 {
				t.Fatalf("disabled bypasses = %v, want 4", got)
			}
		}},
		{"no key, optional route passes through", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			send(t, rt, "POST", "/orders", "", `{"a":1}`)
			w := send(t, rt, "POST", "/orders", "", `{"a":1}`)
			if w.Code != 201 || h.calls.Load() != 2 || h.store.claims.Load() != 0 {
				t.Fatalf("status %d calls=%d claims=%d", w.Code, h.calls.Load(), h.store.claims.Load())
			}
		}},
		{"no key, required route is 400", func(t *testing.T, h *harness) {
			rt := h.route(RouteConfig{Name: "orders", RequireKey: true}, orderHandler)
			w := send(t, rt, "POST", "/orders", "", `{"a":1}`)
			assertJSONError(t, w, 400, `{"error":"Idempotency-Key header is required"}`)
			if h.calls.Load() != 0 || counter(t, h.mw.metrics.rejections.WithLabelValues("orders", "missing_key")) != 1 {
				t.Fatal("handler ran or rejection not counted")
			}
		}},
		{"malformed keys are 400", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			bad := []string{"not-a-uuid", " ", "{" + testKey + "}", "urn:uuid:" + testKey,
				strings.ReplaceAll(testKey, "-", ""), `"` + testKey, testKey + `"`, `"` + testKey + `";a=b`,
				testKey + ";a=b", testKey[:35] + "g", testKey + "0", "'" + testKey + "'"}
			for _, k := range bad {
				r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
				r.Header.Set(HeaderKey, k)
				w := httptest.NewRecorder()
				rt.ServeHTTP(w, r)
				assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be a UUID string"}`)
			}
			// An empty value and the header twice.
			r := httptest.NewRequest("POST", "/orders", nil)
			r.Header[HeaderKey] = []string{""}
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, r)
			assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be a UUID string"}`)
			w = send(t, rt, "POST", "/orders", testKey, `{}`, HeaderKey, testKey)
			assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be a UUID string"}`)
			if h.calls.Load() != 0 || h.store.claims.Load() != 0 {
				t.Fatalf("calls=%d claims=%d, want none", h.calls.Load(), h.store.claims.Load())
			}
		}},
		{"key forms: quoted, upper case and padded keys are the same key", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			for _, k := range []string{strings.ToUpper(testKey), `"` + testKey + `"`, " \t" + testKey + " "} {
				w := send(t, rt, "POST", "/orders", k, `{"a":1}`)
				if w.Header().Get(HeaderReplayed) != "true" {
					t.Fatalf("key %q was not a replay: %d %s", k, w.Code, w.Body)
				}
			}
			if h.calls.Load() != 1 {
				t.Fatalf("calls = %d, want 1", h.calls.Load())
			}
		}},
		{"body over the limit is 413", func(t *testing.T, h *harness) {
			rt := h.route(RouteConfig{Name: "orders", MaxBodyBytes: 16}, orderHandler)
			w := send(t, rt, "POST", "/orders", testKey, strings.Repeat("x", 17))
			assertJSONError(t, w, 413, `{"error":"idempotency_body_too_large"}`)
			// Unknown length (chunked): the limit holds while reading.
			r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader(strings.Repeat("y", 20))))
			r.ContentLength = -1
			r.Header.Set(HeaderKey, testKey)
			w = httptest.NewRecorder()
			rt.ServeHTTP(w, r)
			assertJSONError(t, w, 413, `{"error":"idempotency_body_too_large"}`)
			// Exactly at the limit is fine.
			w = send(t, rt, "POST", "/orders", testKey, strings.Repeat("z", 16))
			if w.Code != 201 {
				t.Fatalf("body at the limit: %d", w.Code)
			}
			if h.calls.Load() != 1 || h.store.claims.Load() != 1 {
				t.Fatalf("calls=%d claims=%d, want 1 and 1", h.calls.Load(), h.store.claims.Load())
			}
		}},
		{"unreadable body is 400 and claims nothing", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader(`{"a":`), errReader{io.ErrUnexpectedEOF}))
			r.Header.Set(HeaderKey, testKey)
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, r)
			assertJSONError(t, w, 400, `{"error":"idempotency_body_unreadable"}`)
			if h.store.claims.Load() != 0 {
				t.Fatal("a claim was made for an unreadable body")
			}
			w = send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			if w.Code != 201 || h.calls.Load() != 1 {
				t.Fatalf("whole body afterwards: %d, calls %d", w.Code, h.calls.Load())
			}
		}},
		{"store unavailable, fail-closed is 503 and runs nothing", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
			h.store.fail.Store(&e)
			w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
			if w.Header().Get("Retry-After") != "1" || h.calls.Load() != 0 {
				t.Fatalf("Retry-After %q, calls %d", w.Header().Get("Retry-After"), h.calls.Load())
			}
			if counter(t, h.mw.metrics.rejections.WithLabelValues("orders", "store_unavailable")) != 1 ||
				counter(t, h.mw.metrics.storeErrors.WithLabelValues("claim", "connection")) != 1 {
				t.Fatal("rejection or store error not counted")
			}
		}},
		{"store unavailable, fail-open runs the handler", func(t *testing.T, h *harness) {
			rt := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
			e := error(&StoreError{Op: "claim", Reason: ReasonTimeout, Err: context.DeadlineExceeded})
			h.store.fail.Store(&e)
			w := send(t, rt, "POST", "/billing", testKey, `{"a":1}`)
			if w.Code != 201 || h.calls.Load() != 1 {
				t.Fatalf("status %d calls %d", w.Code, h.calls.Load())
			}
			if counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", "store_unavailable")) != 1 {
				t.Fatal("bypass not counted")
			}
		}},
		{"new key runs the handler and sends its response", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			if w.Code != 201 || w.Body.String() != `{"id":1,"echo":"{\"a\":1}"}` || w.Header().Get("Set-Cookie") == "" {
				t.Fatalf("got %d %s %v", w.Code, w.Body, w.Header())
			}
			if w.Header().Get(HeaderReplayed) != "" {
				t.Fatal("first response marked as replay")
			}
			if counter(t, h.mw.metrics.miss.WithLabelValues("orders")) != 1 {
				t.Fatal("miss not counted")
			}
		}},
		{"same key, different body is 422", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			w := send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
			assertJSONError(t, w, 422, `{"error":"idempotency_key_body_mismatch"}`)
			// Another query string or path is another request too.
			w = send(t, rt, "POST", "/orders?account=2", testKey, `{"a":1}`)
			assertJSONError(t, w, 422, `{"error":"idempotency_key_body_mismatch"}`)
			// Reformatted JSON is the same request.
			w = send(t, rt, "POST", "/orders", testKey, "{ \"a\" : 1 }\n")
			if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
				t.Fatalf("reformatted body: %d %s", w.Code, w.Body)
			}
			if h.calls.Load() != 1 || counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", "body_mismatch")) != 2 {
				t.Fatal("mismatch executed or was not counted")
			}
		}},
		{"completed key replays status, body, headers", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
				t.Fatalf("status %d replayed %q", w.Code, w.Header().Get(HeaderReplayed))
			}
			var got map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got["idempotency_replayed"] != true || got["id"] != float64(1) || got["echo"] != `{"a":1}` {
				t.Fatalf("replayed body %s", w.Body)
			}
			for k, v := range map[string]string{"Content-Type": "application/json", "Location": "/orders/1", "X-Order-Trace": "t1", "Set-Cookie": ""} {
				if w.Header().Get(k) != v {
					t.Fatalf("replayed header %s = %q, want %q", k, w.Header().Get(k), v)
				}
			}
			if h.calls.Load() != 1 || len(h.replays) != 1 || h.replays[0].OriginalStatus != 201 || h.replays[0].Key != testKey {
				t.Fatalf("calls %d, replay events %+v", h.calls.Load(), h.replays)
			}
			if counter(t, h.mw.metrics.replay.WithLabelValues("orders")) != 1 || counter(t, h.mw.metrics.hit.WithLabelValues("orders")) != 1 {
				t.Fatal("replay or hit not counted")
			}
		}},
		{"completed key whose response was too large is 409 not stored", func(t *testing.T, h *harness) {
			rt := h.route(RouteConfig{Name: "orders", MaxResponseBytes: 8}, orderHandler)
			w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			if w.Code != 201 || !strings.HasPrefix(w.Body.String(), `{"id":1`) {
				t.Fatalf("first response %d %s", w.Code, w.Body)
			}
			w = send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			assertJSONError(t, w, 409, `{"error":"idempotency_response_not_stored","original_status":201}`)
			if h.calls.Load() != 1 {
				t.Fatal("executed twice")
			}
		}},
		{"failed key is 409 previous failed", func(t *testing.T, h *harness) {
			rt := h.route(orders, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "boom", http.StatusInternalServerError)
			})
			if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 500 {
				t.Fatalf("first: %d", w.Code)
			}
			w := send(t, rt, "POST", "/orders", testKey, `{}`)
			assertJSONError(t, w, 409, `{"error":"idempotency_previous_failed"}`)
			if h.calls.Load() != 1 {
				t.Fatal("executed twice")
			}
		}},
		{"in-flight key is 409 with Retry-After", func(t *testing.T, h *harness) {
			release := make(chan struct{})
			started := make(chan struct{})
			rt := h.route(orders, func(w http.ResponseWriter, r *http.Request) {
				close(started)
				<-release
				orderHandler(w, r)
			})
			done := make(chan *httptest.ResponseRecorder)
			go func() { done <- send(t, rt, "POST", "/orders", testKey, `{"a":1}`) }()
			<-started
			w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
			if w.Header().Get("Retry-After") != "5" {
				t.Fatalf("Retry-After = %q", w.Header().Get("Retry-After"))
			}
			close(release)
			if first := <-done; first.Code != 201 {
				t.Fatalf("owner got %d", first.Code)
			}
			if w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`); w.Header().Get(HeaderReplayed) != "true" {
				t.Fatal("no replay after completion")
			}
		}},
		{"stale in-flight key is 409 outcome unknown and stays", func(t *testing.T, h *harness) {
			release := make(chan struct{})
			started := make(chan struct{})
			rt := h.route(orders, func(w http.ResponseWriter, r *http.Request) {
				close(started)
				<-release
				orderHandler(w, r)
			})
			done := make(chan struct{})
			go func() { send(t, rt, "POST", "/orders", testKey, `{"a":1}`); close(done) }()
			<-started
			h.clock.Advance(DefaultLease + time.Second)
			for range 2 {
				w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
				assertJSONError(t, w, 409, `{"error":"idempotency_outcome_unknown"}`)
			}
			close(release)
			<-done
			if h.calls.Load() != 1 || counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", "outcome_unknown")) != 2 {
				t.Fatal("stale key executed again or was not counted")
			}
		}},
		{"expired key is a new key", func(t *testing.T, h *harness) {
			rt := h.route(orders, orderHandler)
			send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
			h.clock.Advance(DefaultTTL + time.Second)
			// A different body is not a 422 against the expired row.
			w := send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
			if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" || h.calls.Load() != 2 {
				t.Fatalf("status %d, calls %d", w.Code, h.calls.Load())
			}
			w = send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
			if w.Header().Get(HeaderReplayed) != "true" || !strings.Contains(w.Body.String(), `\"a\":2`) {
				t.Fatalf("taken-over key does not replay the new response: %s", w.Body)
			}
			if counter(t, h.mw.metrics.miss.WithLabelValues("orders")) != 2 {
				t.Fatal("takeover not counted as a miss")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newHarness(t, Config{}))
		})
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestHandlerOutcomes covers how each kind of handler answer is recorded.
func TestHandlerOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		rc          RouteConfig
		handler     http.HandlerFunc
		wantStatus  int
		wantBody    string // of the replay, or of the second answer
		wantCalls   int64  // after two identical requests
		wantReplay  bool
		wantHeaders map[string]string
	}{
		{name: "400 is deterministic and replayed",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				_, _ = w.Write([]byte(`{"error":"invalid_order"}`))
			},
			wantStatus: 400, wantBody: `{"error":"invalid_order","idempotency_replayed":true}`, wantCalls: 1, wantReplay: true},
		{name: "writing nothing completes as 200 with an empty body",
			handler:    func(w http.ResponseWriter, r *http.Request) {},
			wantStatus: 200, wantBody: ``, wantCalls: 1, wantReplay: true},
		{name: "a text body replays byte for byte",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = w.Write([]byte("  {\"not\": \"json\"}  \n"))
			},
			wantStatus: 200, wantBody: "  {\"not\": \"json\"}  \n", wantCalls: 1, wantReplay: true,
			wantHeaders: map[string]string{"Content-Type": "text/plain; charset=utf-8"}},
		{name: "a binary body replays byte for byte",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write([]byte{0, 1, 2, 0xff, 0xfe})
			},
			wantStatus: 200, wantBody: "\x00\x01\x02\xff\xfe", wantCalls: 1, wantReplay: true},
		{name: "a JSON array replays unchanged",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`[1,2]`))
			},
			wantStatus: 200, wantBody: `[1,2]`, wantCalls: 1, wantReplay: true},
		{name: "an empty JSON object gets the replay field",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(202)
				_, _ = w.Write([]byte(` {} `))
			},
			wantStatus: 202, wantBody: `{"idempotency_replayed":true}`, wantCalls: 1, wantReplay: true},
		{name: "a body that already has the replay field keeps one",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"idempotency_replayed":false}`))
			},
			wantStatus: 200, wantBody: `{"idempotency_replayed":true}`, wantCalls: 1, wantReplay: true},
		{name: "multi-valued replay headers are kept whole",
			rc: RouteConfig{ReplayHeaders: []string{"X-Multi"}},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("X-Multi", "a")
				w.Header().Add("X-Multi", "b")
				w.Header().Set("Authorization", "Bearer x")
				w.Header().Set("WWW-Authenticate", "Basic")
				w.Header().Set("Proxy-Authenticate", "Basic")
			},
			wantStatus: 200, wantBody: ``, wantCalls: 1, wantReplay: true,
			wantHeaders: map[string]string{"X-Multi": "a,b", "Authorization": "", "Www-Authenticate": "", "Proxy-Authenticate": ""}},
		{name: "429 releases the key",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
			},
			wantStatus: 429, wantBody: ``, wantCalls: 2},
		{name: "503 fails the key",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			wantStatus: 409, wantBody: `{"error":"idempotency_previous_failed"}`, wantCalls: 1},
		{name: "no-store route releases the key on completion",
			rc: RouteConfig{NoStore: true},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(201)
				_, _ = w.Write([]byte("personal data"))
			},
			wantStatus: 201, wantBody: `personal data`, wantCalls: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			c.rc.Name = "r"
			rt := h.route(c.rc, c.handler)
			send(t, rt, "POST", "/r", testKey, `{"q":1}`)
			w := send(t, rt, "POST", "/r", testKey, `{"q":1}`)
			if w.Code != c.wantStatus || w.Body.String() != c.wantBody {
				t.Fatalf("second answer = %d %q, want %d %q", w.Code, w.Body, c.wantStatus, c.wantBody)
			}
			if got := h.calls.Load(); got != c.wantCalls {
				t.Fatalf("calls = %d, want %d", got, c.wantCalls)
			}
			if (w.Header().Get(HeaderReplayed) == "true") != c.wantReplay {
				t.Fatalf("Idempotent-Replayed = %q", w.Header().Get(HeaderReplayed))
			}
			for k, v := range c.wantHeaders {
				if got := strings.Join(w.Header().Values(k), ","); got != v {
					t.Fatalf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestPanicFailsKeyAndIsReraised(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) { panic("fill engine exploded") })
	func() {
		defer func() {
			if p := recover(); p != "fill engine exploded" {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		send(t, rt, "POST", "/r", testKey, `{}`)
		t.Fatal("panic was swallowed")
	}()
	w := send(t, rt, "POST", "/r", testKey, `{}`)
	assertJSONError(t, w, 409, `{"error":"idempotency_previous_failed"}`)
	if h.calls.Load() != 1 {
		t.Fatalf("calls = %d", h.calls.Load())
	}
}

// TestBadHandlers: a handler that writes an invalid status code or calls
// runtime.Goexit fails its key instead of poisoning it or escaping.
func TestBadHandlers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	bad := h.route(RouteConfig{Name: "bad"}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(42) })
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Fatal("an invalid status code did not panic")
			}
		}()
		send(t, bad, "POST", "/bad", testKey, `{}`)
	}()
	assertJSONError(t, send(t, bad, "POST", "/bad", testKey, `{}`), 409, `{"error":"idempotency_previous_failed"}`)

	exits := h.route(RouteConfig{Name: "exit"}, func(w http.ResponseWriter, r *http.Request) { runtime.Goexit() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, exits, "POST", "/exit", testKey, `{}`)
	}()
	<-done
	assertJSONError(t, send(t, exits, "POST", "/exit", testKey, `{}`), 409, `{"error":"idempotency_previous_failed"}`)
	if h.calls.Load() != 2 {
		t.Fatalf("calls = %d, want 2", h.calls.Load())
	}
}

// TestOneKeyManyGoroutines: 200 concurrent requests with one key execute the
// handler exactly once; every other answer is a replay or a 409 in flight.
func TestOneKeyManyGoroutines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	const n = 200
	start := make(chan struct{})
	codes := make(chan *httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes <- send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	var fresh, replays, inFlight int
	for w := range codes {
		switch {
		case w.Code == 201 && w.Header().Get(HeaderReplayed) == "true":
			replays++
		case w.Code == 201:
			fresh++
		case w.Code == 409 && strings.Contains(w.Body.String(), "idempotency_in_flight"):
			inFlight++
		default:
			t.Fatalf("unexpected answer %d %s", w.Code, w.Body)
		}
	}
	if h.calls.Load() != 1 || fresh != 1 || replays+inFlight != n-1 {
		t.Fatalf("calls=%d fresh=%d replays=%d inFlight=%d", h.calls.Load(), fresh, replays, inFlight)
	}
}

func TestScoping(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	a := h.route(RouteConfig{Name: "a"}, orderHandler)
	b := h.route(RouteConfig{Name: "b"}, orderHandler)
	send(t, a, "POST", "/x", testKey, `{}`, "X-User", "1")
	if w := send(t, a, "POST", "/x", testKey, `{}`, "X-User", "2"); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("user 2 got user 1's replay")
	}
	if w := send(t, b, "POST", "/x", testKey, `{}`, "X-User", "1"); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("endpoint b got endpoint a's replay")
	}
	if w := send(t, a, "POST", "/x", testKey, `{}`, "X-User", "1"); w.Header().Get(HeaderReplayed) != "true" {
		t.Fatal("same user, same endpoint did not replay")
	}
	if h.calls.Load() != 3 {
		t.Fatalf("calls = %d, want 3", h.calls.Load())
	}
}

// TestEndpointNames: the route's name, else the ServeMux pattern, else
// method and path (labelled "unnamed", so two unnamed routes never share
// keys).
func TestEndpointNames(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{account}", h.route(RouteConfig{}, orderHandler))
	send(t, mux, "POST", "/orders/1", testKey, `{}`)
	if counter(t, h.mw.metrics.miss.WithLabelValues("POST /orders/{account}")) != 1 {
		t.Fatal("the ServeMux pattern is not the label")
	}
	unnamed := h.route(RouteConfig{}, orderHandler)
	send(t, unnamed, "POST", "/a", testKey, `{}`)
	if w := send(t, unnamed, "POST", "/b", testKey, `{}`); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("two unnamed paths shared a key")
	}
	if counter(t, h.mw.metrics.miss.WithLabelValues("unnamed")) != 2 {
		t.Fatal("unnamed routes not labelled unnamed")
	}
	rows, _ := h.store.ExportScope(context.Background(), "")
	var endpoints []string
	for _, r := range rows {
		endpoints = append(endpoints, r.Endpoint)
	}
	if strings.Join(endpoints, "|") != "POST /orders/{account}|POST /a|POST /b" {
		t.Fatalf("stored endpoints %q", endpoints)
	}
}

func TestKeyFromContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var got string
	var deadline bool
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) {
		got, _ = KeyFromContext(r.Context())
		_, deadline = r.Context().Deadline()
	})
	send(t, rt, "POST", "/r", strings.ToUpper(testKey), `{}`)
	if got != testKey || !deadline {
		t.Fatalf("key %q deadline %v: want the lower-case key and a deadline", got, deadline)
	}
	got, deadline = "x", true
	send(t, rt, "POST", "/r", "", `{}`)
	if got != "" || deadline {
		t.Fatalf("pass-through: key %q deadline %v, want none", got, deadline)
	}
}

// TestStoreTimeouts: a store that never answers is given up on at the
// store deadline (the claim's context carries it), so a fail-closed route
// answers 503 without running the handler, and a fail-open route runs it
// and counts a bypass. The wall-clock bound only proves nothing hangs.
func TestStoreTimeouts(t *testing.T) {
	t.Parallel()
	const storeTimeout, hang = 50 * time.Millisecond, 5 * time.Second
	h := newHarness(t, Config{StoreTimeout: storeTimeout, Lease: time.Second})
	h.store.block.Store(true)
	closed := h.route(RouteConfig{Name: "orders"}, orderHandler)
	open := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	// sendTimed sends one request and checks the blocked claim's deadline
	// was the store timeout from when the claim began.
	sendTimed := func(rt http.Handler, path string) *httptest.ResponseRecorder {
		t.Helper()
		h.store.blocked.Store(nil)
		before := time.Now()
		w := send(t, rt, "POST", path, testKey, `{}`)
		if el := time.Since(before); el > hang {
			t.Fatalf("%s answered after %v: a blocked store held the request", path, el)
		}
		b := h.store.blocked.Load()
		if b == nil {
			t.Fatalf("%s: the claim never reached the store", path)
		}
		if d := b[1]; d.Before(before.Add(storeTimeout)) || d.After(b[0].Add(storeTimeout)) {
			t.Fatalf("%s: the claim's deadline is %v after the request began, want the store timeout %v from the claim",
				path, d.Sub(before), storeTimeout)
		}
		return w
	}

	w := sendTimed(closed, "/orders")
	assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
	if h.calls.Load() != 0 {
		t.Fatal("fail-closed ran the handler")
	}
	w = sendTimed(open, "/billing")
	if w.Code != 201 || h.calls.Load() != 1 {
		t.Fatalf("fail-open: %d, calls %d", w.Code, h.calls.Load())
	}
	if counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", "store_unavailable")) != 1 ||
		counter(t, h.mw.metrics.storeErrors.WithLabelValues("claim", "timeout")) != 2 {
		t.Fatal("bypass or timeouts not counted")
	}
}

// recordFailStore claims normally but cannot record outcomes.
type recordFailStore struct{ *MemoryStore }

func (s recordFailStore) Complete(context.Context, Fence, Response) error {
	return &StoreError{Op: "complete", Reason: ReasonConnection, Err: errors.New("connection reset")}
}

// TestRecordFailureLeavesKeyInFlight: the client still gets the real
// response, the key is never executed again and later answers outcome
// unknown.
func TestRecordFailureLeavesKeyInFlight(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	ms := NewMemoryStore()
	ms.now = clock.Now
	reg := prometheus.NewRegistry()
	mw, err := New(recordFailStore{ms}, Config{Lease: 300 * time.Millisecond, StoreTimeout: 50 * time.Millisecond,
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		orderHandler(w, r)
	}))
	w := send(t, rt, "POST", "/orders", testKey, `{}`)
	if w.Code != 201 || !strings.HasPrefix(w.Body.String(), `{"id":1`) {
		t.Fatalf("client did not get the real response: %d %s", w.Code, w.Body)
	}
	if testutil.ToFloat64(mw.metrics.recordFailures.WithLabelValues("orders")) != 1 {
		t.Fatal("record failure not counted")
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
		t.Fatalf("inside the lease: %d %s", w.Code, w.Body)
	}
	clock.Advance(time.Second)
	w = send(t, rt, "POST", "/orders", testKey, `{}`)
	assertJSONError(t, w, 409, `{"error":"idempotency_outcome_unknown"}`)
	if calls.Load() != 1 {
		t.Fatalf("calls = %d, want 1", calls.Load())
	}
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

func (s *dataErrorStore) Complete(context.Context, Fence, Response) error {
	s.completes.Add(1)
	return &StoreError{Op: "complete", Reason: ReasonData, Err: errors.New("value out of range")}
}

// TestDataErrors: a store that refuses a request's values is not down. The
// record is not retried until the lease runs out (the client would wait for
// nothing), and a refused claim is a 400 on both policies: a fail-open route
// does not bypass (every retry would run).
func TestDataErrors(t *testing.T) {
	t.Parallel()
	quietLog := slog.New(slog.NewTextHandler(io.Discard, nil))

	t.Run("RecordNotRetried", func(t *testing.T) {
		t.Parallel()
		s := &dataErrorStore{MemoryStore: NewMemoryStore()}
		mw, err := New(s, Config{Lease: time.Minute, StoreTimeout: time.Second, Registerer: prometheus.NewRegistry(), Logger: quietLog})
		if err != nil {
			t.Fatal(err)
		}
		rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(orderHandler))
		w := send(t, rt, "POST", "/orders", testKey, `{}`)
		if w.Code != 201 {
			t.Fatalf("client did not get the real response: %d %s", w.Code, w.Body)
		}
		if n := s.completes.Load(); n != 1 {
			t.Errorf("Complete called %d times for a refused value, want 1", n)
		}
		if testutil.ToFloat64(mw.metrics.recordFailures.WithLabelValues("orders")) != 1 {
			t.Error("record failure not counted")
		}
	})

	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("ClaimRefusedFailOpen=%v", failOpen), func(t *testing.T) {
			t.Parallel()
			s := &dataErrorStore{MemoryStore: NewMemoryStore(), claims: true}
			mw, err := New(s, Config{Registerer: prometheus.NewRegistry(), Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			rt := mw.MustRoute(RouteConfig{Name: "billing", FailOpen: failOpen})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			w := send(t, rt, "POST", "/billing", testKey, `{}`)
			// DESIGN.md: a value the store refuses is 400 on both
			// policies: a 503 would invite retries that cannot succeed.
			assertJSONError(t, w, 400, `{"error":"idempotency_scope_invalid"}`)
			if n := testutil.ToFloat64(mw.metrics.rejections.WithLabelValues("billing", reasonInvalidScope)); n != 1 {
				t.Errorf("invalid_scope rejections = %v, want 1", n)
			}
			if calls.Load() != 0 {
				t.Errorf("handler ran %d times on a refused claim", calls.Load())
			}
			if n := testutil.ToFloat64(mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
				t.Errorf("bypasses = %v, want 0", n)
			}
		})
	}
}

// TestMemoryStoreFull: a full memory store refuses new keys with 503 on a
// fail-open route too, without running the handler: a client that fills
// the store on purpose must not earn a bypass. Stored keys still replay.
func TestMemoryStoreFull(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	MemoryMaxRows(2)(h.store.MemoryStore)
	billing := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	orders := h.route(RouteConfig{Name: "orders"}, orderHandler)
	keys := []string{uuid.NewString(), uuid.NewString()}
	for _, k := range keys {
		if w := send(t, billing, "POST", "/billing", k, `{"plan":"pro"}`); w.Code != 201 {
			t.Fatalf("below the cap: %d %s", w.Code, w.Body)
		}
	}

	for _, rt := range []struct {
		name string
		h    http.Handler
	}{{"billing", billing}, {"orders", orders}} {
		w := send(t, rt.h, "POST", "/x", uuid.NewString(), `{"plan":"pro"}`)
		assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
		if w.Header().Get("Retry-After") != "1" {
			t.Errorf("%s: Retry-After %q, want 1", rt.name, w.Header().Get("Retry-After"))
		}
		if n := counter(t, h.mw.metrics.rejections.WithLabelValues(rt.name, reasonStoreUnavailable)); n != 1 {
			t.Errorf("%s: store_unavailable rejections = %v, want 1", rt.name, n)
		}
	}
	if n := h.calls.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2: a full store was bypassed", n)
	}
	if n := counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
		t.Errorf("bypasses = %v, want 0", n)
	}
	if n := counter(t, h.mw.metrics.storeErrors.WithLabelValues("claim", ReasonFull)); n != 2 {
		t.Errorf("store errors (claim, full) = %v, want 2", n)
	}

	// The stored keys replay; once they expire, new keys are served again.
	w := send(t, billing, "POST", "/billing", keys[0], `{"plan":"pro"}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("replay in a full store: %d, replayed %q", w.Code, w.Header().Get(HeaderReplayed))
	}
	h.clock.Advance(DefaultTTL + time.Minute)
	if w := send(t, billing, "POST", "/billing", uuid.NewString(), `{"plan":"pro"}`); w.Code != 201 || h.calls.Load() != 3 {
		t.Errorf("after the keys expired: %d, %d handler runs", w.Code, h.calls.Load())
	}
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

// TestClaimTooSlowForTheHandler: a claim so slow that the handler's
// deadline (lease less store timeout) has passed when it returns does not
// run the handler with a dead context (which would fail the key for its
// whole TTL): the key is released and the client gets 503; its retry runs.
func TestClaimTooSlowForTheHandler(t *testing.T) {
	t.Parallel()
	s := &slowClaimStore{MemoryStore: NewMemoryStore(), delay: 150 * time.Millisecond}
	mw, err := New(s, Config{Lease: 300 * time.Millisecond, StoreTimeout: 200 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		orderHandler(w, r)
	}))
	w := send(t, rt, "POST", "/orders", testKey, `{}`)
	assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
	if w.Header().Get("Retry-After") != "1" || calls.Load() != 0 {
		t.Fatalf("Retry-After %q, handler ran %d times", w.Header().Get("Retry-After"), calls.Load())
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 || calls.Load() != 1 {
		t.Fatalf("retry after the release: %d %s, %d executions", w.Code, w.Body, calls.Load())
	}
}

// TestUnstorableScope: a scope or endpoint the store cannot hold (not
// UTF-8, a NUL byte, over 1 KiB) is refused before any claim, fail-open or
// not, and nothing is stored.
func TestUnstorableScope(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		scope, path string
		fits        bool
	}{
		"InvalidUTF8":  {scope: "tenant-\xff", path: "/billing"},
		"NUL":          {scope: "a\x00b", path: "/billing"},
		"LongScope":    {scope: strings.Repeat("u", maxScopeBytes+1), path: "/billing"},
		"LongPath":     {scope: "42", path: "/" + strings.Repeat("p", maxScopeBytes)},
		"LongestScope": {scope: strings.Repeat("u", maxScopeBytes), path: "/billing", fits: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := NewMemoryStore()
			mw, err := New(store, Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Scope: func(*http.Request) string { return c.scope }})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			// No Name and no pattern: the endpoint is the method and path.
			rt := mw.MustRoute(RouteConfig{FailOpen: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			w := send(t, rt, "POST", c.path, testKey, `{}`)
			if c.fits {
				if w.Code != 201 || calls.Load() != 1 {
					t.Fatalf("a scope of %d bytes: %d, %d calls; want it run", len(c.scope), w.Code, calls.Load())
				}
				return
			}
			assertJSONError(t, w, 400, `{"error":"idempotency_scope_invalid"}`)
			if calls.Load() != 0 || len(store.rows) != 0 {
				t.Errorf("handler ran %d times, %d rows stored", calls.Load(), len(store.rows))
			}
			if n := testutil.ToFloat64(mw.metrics.rejections.WithLabelValues(unnamedEndpoint, reasonInvalidScope)); n != 1 {
				t.Errorf("rejections{invalid_scope} = %v, want 1", n)
			}
		})
	}
}

// TestStreamingHandler: a handler that flushes streams its response; the
// record follows and the retry replays the whole body.
func TestStreamingHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	firstSent := make(chan struct{})
	proceed := make(chan struct{})
	rt := h.route(RouteConfig{Name: "stream"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("part1;"))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		close(firstSent)
		<-proceed
		_, _ = w.Write([]byte("part2"))
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set(HeaderKey, testKey)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-firstSent
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "part1;" {
		t.Fatalf("first part not streamed before the handler finished: %q %v", buf, err)
	}
	close(proceed)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "part2" {
		t.Fatalf("rest = %q", rest)
	}
	w := send(t, rt, "POST", "/", testKey, `{}`)
	if w.Body.String() != "part1;part2" || w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("replay = %q", w.Body)
	}
}

func TestHijackRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var herr error
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) {
		_, _, herr = http.NewResponseController(w).Hijack()
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Set(HeaderKey, testKey)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !errors.Is(herr, errHijack) {
		t.Fatalf("Hijack error = %v", herr)
	}
}

// TestClientHangsUp: the handler's context is detached from the client's
// connection, so an order finishes when its client goes away, and the
// retry replays it. The handler waits until the server has seen the
// hang-up (the request's own context is cancelled), then checks its own.
func TestClientHangsUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	started := make(chan struct{})
	hungUp := make(chan context.Context, 1) // the server-side request's context
	finished := make(chan error, 1)
	rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-(<-hungUp).Done():
		case <-time.After(10 * time.Second):
			finished <- errors.New("the server never noticed the client hang up")
			return
		}
		if err := r.Context().Err(); err != nil {
			finished <- fmt.Errorf("handler context ended with the client: %w", err)
			return
		}
		orderHandler(w, r)
		finished <- nil
	})
	served := make(chan struct{}) // the middleware has recorded and answered
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hungUp <- r.Context()
		rt.ServeHTTP(w, r)
		close(served)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set(HeaderKey, testKey)
	errc := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the client did not hang up")
	}
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
	<-served
	w := send(t, rt, "POST", "/", testKey, `{}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || h.calls.Load() != 1 {
		t.Fatalf("retry: %d replayed=%q calls=%d", w.Code, w.Header().Get(HeaderReplayed), h.calls.Load())
	}
}

// TestBodyCutShort: a client that promises more body than it sends gets
// 400, the key is not claimed, and the whole body then executes. The
// client half-closes its connection after the short body, so it always
// reads the server's answer.
func TestBodyCutShort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	srv := httptest.NewServer(rt)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second)) // never hang
	if _, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"+
		HeaderKey+": "+testKey+"\r\nContent-Length: 100\r\n\r\n{\"a\":"); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the short body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || strings.TrimSpace(string(body)) != `{"error":"idempotency_body_unreadable"}` {
		t.Fatalf("short body answered %d %s", resp.StatusCode, body)
	}
	if h.store.claims.Load() != 0 || h.calls.Load() != 0 ||
		counter(t, h.mw.metrics.rejections.WithLabelValues("orders", "body_unreadable")) != 1 {
		t.Fatalf("claims=%d calls=%d after a short body, or the rejection not counted", h.store.claims.Load(), h.calls.Load())
	}
	w := send(t, rt, "POST", "/", testKey, `{"a":1}`)
	if w.Code != 201 || h.calls.Load() != 1 {
		t.Fatalf("whole body: %d calls %d", w.Code, h.calls.Load())
	}
}

// TestDeepNesting: hashing a body nested 200,000 levels deep stays bounded
// and answers below 500.
func TestDeepNesting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r", MaxBodyBytes: 1 << 20}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
	})
	body := strings.Repeat("[", 200000) + strings.Repeat("]", 200000)
	w := send(t, rt, "POST", "/r", testKey, body)
	if w.Code >= 500 {
		t.Fatalf("status %d", w.Code)
	}
	if w := send(t, rt, "POST", "/r", testKey, body); w.Code != 400 || w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("replay of deep body: %d", w.Code)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	if _, err := New(nil, Config{}); err == nil {
		t.Fatal("nil store accepted")
	}
	for _, cfg := range []Config{
		{Lease: time.Second, StoreTimeout: 2 * time.Second},
		{Lease: 2 * time.Second, StoreTimeout: 2 * time.Second},
		{Lease: -1},
		{StoreTimeout: -1},
	} {
		if _, err := New(store, cfg); err == nil {
			t.Fatalf("config %+v accepted", cfg)
		}
	}
	mw, err := New(store, Config{Lease: 45 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range []RouteConfig{
		{TTL: MaxTTL + time.Second},
		{TTL: 59 * time.Second},
		{TTL: 89 * time.Second}, // under twice the lease
		{MaxBodyBytes: -1},
		{MaxResponseBytes: -1},
		{Name: "orders\xff"},
		{Name: strings.Repeat("n", maxScopeBytes+1)},
		{ReplayHeaders: []string{"set-cookie"}},
		{ReplayHeaders: []string{"Proxy-Authorization"}},
		{ReplayHeaders: []string{"Date"}},
		{ReleaseOnError: true},
		{Transactional: true, FailOpen: true},
		{Transactional: true}, // a memory store cannot run transactions
	} {
		if _, err := mw.Route(rc); err == nil {
			t.Fatalf("route config %+v accepted", rc)
		}
	}
	if _, err := mw.Route(RouteConfig{TTL: 90 * time.Second}); err != nil {
		t.Fatalf("twice the lease refused: %v", err)
	}
	if _, err := mw.Route(RouteConfig{TTL: MaxTTL, ReplayHeaders: []string{"x-request-id"}}); err != nil {
		t.Fatalf("seven days refused: %v", err)
	}
	// The same registry twice is a construction error, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := New(store, Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(store, Config{Registerer: reg}); err == nil {
		t.Fatal("double registration accepted")
	}
}

func TestFlagEnabled(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"": true, "1": true, "true": true, "on": true, "yes": true, "anything": true,
		"0": false, "false": false, "FALSE": false, " off ": false, "No": false, "\tfalse\n": false,
	} {
		if got := flagEnabled(v); got != want {
			t.Fatalf("flagEnabled(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestReplayHookFailure: when the host cannot audit a replay, a fail-closed
// route refuses it with 503 (the retry gets the replay once auditing works);
// a fail-open route replays anyway.
func TestReplayHookFailure(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	orders := h.route(RouteConfig{Name: "orders"}, orderHandler)
	billing := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	send(t, orders, "POST", "/orders", testKey, `{}`)
	send(t, billing, "POST", "/billing", testKey, `{}`)
	h.mu.Lock()
	h.hookErr = errors.New("audit_log unavailable")
	h.mu.Unlock()
	w := send(t, orders, "POST", "/orders", testKey, `{}`)
	assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
	if w.Header().Get("Retry-After") != "1" {
		t.Fatalf("refused replay: Retry-After %q, want 1", w.Header().Get("Retry-After"))
	}
	if w := send(t, billing, "POST", "/billing", testKey, `{}`); w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("fail-open route did not replay: %d %s", w.Code, w.Body)
	}
	// The refusal is counted as a rejection; the fail-open replay is not.
	for route, want := range map[string]float64{"orders": 1, "billing": 0} {
		if n := counter(t, h.mw.metrics.rejections.WithLabelValues(route, reasonStoreUnavailable)); n != want {
			t.Fatalf("rejections{%s,store_unavailable} = %v, want %v", route, n, want)
		}
	}
	if n := counter(t, h.mw.metrics.replay.WithLabelValues("orders")); n != 0 {
		t.Fatalf("the refused replay was counted as a replay (%v)", n)
	}
	h.mu.Lock()
	h.hookErr = nil
	h.mu.Unlock()
	if w := send(t, orders, "POST", "/orders", testKey, `{}`); w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("no replay once the hook works: %d", w.Code)
	}
	if h.calls.Load() != 2 {
		t.Fatalf("calls = %d, want 2", h.calls.Load())
	}
}

func TestEnabledFrom(t *testing.T) {
	t.Parallel()
	env := map[string]string{FlagEnv: " Off "}
	enabled := EnabledFrom(func(k string) string { return env[k] })
	if enabled(nil) {
		t.Fatal("Off did not disable")
	}
	env[FlagEnv] = "yes"
	if !enabled(nil) {
		t.Fatal("yes did not enable (it is read per request)")
	}
}

func TestEnabledFromEnv(t *testing.T) {
	t.Setenv(FlagEnv, "off")
	if EnabledFromEnv(nil) {
		t.Fatal("off did not disable")
	}
	t.Setenv(FlagEnv, "1")
	if !EnabledFromEnv(nil) {
		t.Fatal("1 did not enable")
	}
}

func TestCleanupAndErase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, orderHandler)
	for i, k := range []string{testKey, testKey2} {
		send(t, rt, "POST", "/r", k, `{}`, "X-User", string(rune('1'+i)))
	}
	if res, err := h.mw.Erase(context.Background(), "1"); err != nil || res.Deleted != 1 {
		t.Fatalf("erase: %+v %v", res, err)
	}
	h.clock.Advance(DefaultTTL + time.Minute)
	n, err := h.mw.Cleanup(context.Background(), 1)
	if err != nil || n != 1 {
		t.Fatalf("cleanup deleted %d (%v), want 1", n, err)
	}
	if counter(t, h.mw.metrics.cleanupDeleted) != 1 {
		t.Fatal("cleanup not counted")
	}
}

// TestBodyLongerThanDeclared: a body a wrapper replaced without fixing
// Content-Length is read whole, so two different bodies never share a
// hash (and a 422 stays a 422).
func TestBodyLongerThanDeclared(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, orderHandler)
	for i, body := range []string{`{"a":1}`, `{"a":1,"b":2}`} {
		r := httptest.NewRequest("POST", "/r", strings.NewReader(body))
		r.ContentLength = 3 // stale
		r.Header.Set(HeaderKey, testKey)
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		if want := []int{201, 422}[i]; w.Code != want {
			t.Fatalf("body %s: %d, want %d", body, w.Code, want)
		}
	}
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

// TestContentionIsInFlight: a claim that loses to contention (the store's
// conflict reason) answers 409 in flight on both policies: never a
// fail-open bypass, which would run the handler while another request owns
// the key, and never 503.
func TestContentionIsInFlight(t *testing.T) {
	t.Parallel()
	for _, expired := range []bool{false, true} {
		for _, failOpen := range []bool{false, true} {
			t.Run(fmt.Sprintf("takeover=%v/FailOpen=%v", expired, failOpen), func(t *testing.T) {
				t.Parallel()
				mw, err := New(&contentionStore{MemoryStore: NewMemoryStore(), expired: expired},
					Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					t.Fatal(err)
				}
				var calls atomic.Int64
				rt := mw.MustRoute(RouteConfig{Name: "billing", FailOpen: failOpen})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					w.WriteHeader(http.StatusCreated)
				}))
				w := send(t, rt, "POST", "/billing", testKey, `{}`)
				assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
				if w.Header().Get("Retry-After") != "5" {
					t.Errorf("Retry-After = %q, want 5", w.Header().Get("Retry-After"))
				}
				if calls.Load() != 0 {
					t.Errorf("handler ran %d times while another request owned the key", calls.Load())
				}
				if n := testutil.ToFloat64(mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
					t.Errorf("bypasses = %v, want 0", n)
				}
				if n := testutil.ToFloat64(mw.metrics.conflicts.WithLabelValues("billing", reasonInFlight)); n != 1 {
					t.Errorf("in-flight conflicts = %v, want 1", n)
				}
			})
		}
	}
}

// TestMaxBodyBytesUnlimited: math.MaxInt64 means no limit. It used to
// overflow the one byte read past the limit, so every chunked body reached
// the handler empty and all of them hashed alike.
func TestMaxBodyBytesUnlimited(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var got []string
	rt := h.route(RouteConfig{Name: "orders", MaxBodyBytes: math.MaxInt64}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
		w.WriteHeader(http.StatusCreated)
	})
	for i, body := range []string{`{"qty":1}`, `{"qty":1000}`} {
		r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader(body))) // no length: chunked
		r.ContentLength = -1
		r.Header.Set(HeaderKey, testKey)
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		if want := []int{201, 422}[i]; w.Code != want {
			t.Fatalf("body %s: %d %s, want %d", body, w.Code, w.Body, want)
		}
	}
	if len(got) != 1 || got[0] != `{"qty":1}` {
		t.Fatalf("the handler saw %q, want the one body whole", got)
	}
}
