package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

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
			down := error(&StoreError{Op: "probe", Reason: ReasonConnection, Err: errors.New("connection refused")})
			h.store.probe.Store(&down) // the outage probe fails too: the bypass's evidence
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

// TestWarnLogs: a fail-open bypass and an outcome_unknown answer each log
// one WARN line naming what happened.
func TestWarnLogs(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := newHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	warns := func(msg string) int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, msg) {
				n++
			}
		}
		return n
	}

	billing := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
	h.store.fail.Store(&e)
	h.store.probe.Store(&e) // the outage probe fails too: the bypass's evidence
	send(t, billing, "POST", "/billing", testKey, `{}`)
	h.store.fail.Store(nil)
	if n := warns(`msg="idempotency: store unavailable, the outage probe failed: running without deduplication"`); n != 1 || !strings.Contains(logs.String(), "endpoint=billing") {
		t.Fatalf("%d WARN lines for the bypass, want 1:\n%s", n, logs.String())
	}

	started, release := make(chan struct{}), make(chan struct{})
	orders := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	})
	done := make(chan struct{})
	go func() { defer close(done); send(t, orders, "POST", "/orders", testKey, `{}`) }()
	<-started
	h.clock.Advance(DefaultLease + time.Second)
	assertJSONError(t, send(t, orders, "POST", "/orders", testKey, `{}`), 409, `{"error":"idempotency_outcome_unknown"}`)
	close(release)
	<-done
	if n := warns(`msg="idempotency: stale in-flight key, outcome unknown"`); n != 1 || !strings.Contains(logs.String(), "key="+testKey) {
		t.Fatalf("%d WARN lines for outcome_unknown, want 1:\n%s", n, logs.String())
	}
}
