package idempotency

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

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

// TestNoTrailersOnReplay: trailers are not recorded; a replay carries
// neither the trailer nor its declaration.
func TestNoTrailersOnReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	// X-Checksum is also a replayed header of the route: declared as a
	// trailer, its value is still a trailer and is not recorded.
	rt := h.route(RouteConfig{Name: "r", ReplayHeaders: []string{"X-Checksum"}}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "x-checksum")
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "z")
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	var replay *http.Response
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // trailers arrive after the body
		resp.Body.Close()
		replay = resp
	}
	if replay.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("second answer is not a replay: %d", replay.StatusCode)
	}
	if len(replay.Trailer) != 0 || replay.Header.Get("Trailer") != "" || replay.Header.Get("X-Checksum") != "" || replay.Header.Get("X-Late") != "" {
		t.Fatalf("replay carries trailers: trailer %v, header %v", replay.Trailer, replay.Header)
	}
}
