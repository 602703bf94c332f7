package idempotency

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCoverageProbeAnsweredByWrapper: a request marked by WithCoverageProbe
// gets 204 with Idempotency-Probe: wrapped from every kind of wrapped
// route, with or without a key, with the kill-switch on or off; nothing is
// claimed and the handler never runs. The header alone, sent by a client,
// is no probe.
func TestCoverageProbeAnsweredByWrapper(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rc   RouteConfig
		key  string
		off  bool
	}{
		{name: "optional key, keyless", rc: RouteConfig{Name: "orders"}},
		{name: "optional key, keyed", rc: RouteConfig{Name: "orders"}, key: "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f"},
		{name: "required key, keyless", rc: RouteConfig{Name: "orders", RequireKey: true}},
		{name: "fail-open, keyed", rc: RouteConfig{Name: "billing", FailOpen: true}, key: "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f"},
		{name: "kill-switch off", rc: RouteConfig{Name: "orders"}, key: "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f", off: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			h.enabled.Store(!tc.off)
			rt := h.route(tc.rc, orderHandler)
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
			if tc.key != "" {
				r.Header.Set(HeaderKey, tc.key)
			}
			r = r.WithContext(WithCoverageProbe(r.Context()))
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, r)
			if w.Code != http.StatusNoContent || w.Header().Get("Idempotency-Probe") != "wrapped" || w.Body.Len() != 0 {
				t.Fatalf("probe answered %d, Idempotency-Probe %q, body %q; want 204, wrapped, empty",
					w.Code, w.Header().Get("Idempotency-Probe"), w.Body)
			}
			if h.calls.Load() != 0 || h.store.claims.Load() != 0 {
				t.Fatalf("probe ran the handler %d times and claimed %d keys; want 0, 0", h.calls.Load(), h.store.claims.Load())
			}
		})
	}
	t.Run("header without the marker", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, Config{})
		rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
		w := send(t, rt, http.MethodPost, "/orders", "", `{}`, "Idempotency-Probe", "wrapped")
		if w.Code != http.StatusCreated || h.calls.Load() != 1 {
			t.Fatalf("a client's Idempotency-Probe header: status %d, handler ran %d times; want 201, 1 (no probe)", w.Code, h.calls.Load())
		}
	})
}

// refuseMux is a ServeMux with a wrapped order route (listed), an
// unwrapped user route, a cancel route registered without a method, and
// reads; every handler counts its runs.
func refuseMux(ran *int) (*http.ServeMux, http.Handler) {
	mux := http.NewServeMux()
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { *ran++; w.WriteHeader(http.StatusCreated) })
	for _, p := range []string{"POST /orders", "GET /orders", "POST /users", "/orders/{id}"} {
		mux.Handle(p, h)
	}
	refuse := RefuseUnlisted([]string{"POST /orders", "DELETE  /orders/{id}"},
		func(r *http.Request) string { _, p := mux.Handler(r); return p })
	return mux, refuse(mux)
}

// TestRefuseUnlisted: a keyed request with a non-safe method to a route
// that is not listed gets 400 idempotency_key_unsupported and its handler
// never runs; a keyless request, a safe method, a listed route (with its
// method or through a pattern for every method) and an unknown path pass
// to the router.
func TestRefuseUnlisted(t *testing.T) {
	t.Parallel()
	const key = "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f"
	for _, tc := range []struct {
		method, path, key string
		probe             bool
		want              int // 400 refused; otherwise the router's answer
	}{
		{method: "POST", path: "/users", key: key, want: http.StatusBadRequest},
		{method: "POST", path: "/users", probe: true, want: http.StatusBadRequest},
		{method: "PUT", path: "/orders/7", key: key, want: http.StatusBadRequest},
		{method: "POST", path: "/users", want: http.StatusCreated},
		{method: "GET", path: "/orders", key: key, want: http.StatusCreated},
		{method: "HEAD", path: "/orders", key: key, want: http.StatusCreated},
		{method: "POST", path: "/orders", key: key, want: http.StatusCreated},
		{method: "DELETE", path: "/orders/7", key: key, want: http.StatusCreated},
		{method: "POST", path: "/nowhere", key: key, want: http.StatusNotFound},
	} {
		name := tc.method + " " + tc.path
		if tc.key != "" {
			name += " keyed"
		}
		if tc.probe {
			name += " probe"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ran := 0
			_, h := refuseMux(&ran)
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{}`))
			if tc.key != "" {
				r.Header.Set(HeaderKey, tc.key)
			}
			if tc.probe {
				r = r.WithContext(WithCoverageProbe(r.Context()))
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d (body %s)", w.Code, tc.want, w.Body)
			}
			if tc.want != http.StatusBadRequest {
				return
			}
			if ran != 0 {
				t.Fatalf("the handler ran %d times behind a refusal", ran)
			}
			assertJSONError(t, w, http.StatusBadRequest, `{"error":"idempotency_key_unsupported"}`)
		})
	}
}

// TestRefuseUnlistedNeedsLookup: a nil lookup is a configuration error,
// found when the middleware is built.
func TestRefuseUnlistedNeedsLookup(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Fatal("RefuseUnlisted(nil lookup) did not panic")
		}
	}()
	RefuseUnlisted(nil, nil)
}

// TestCoverageProbeMarker: only WithCoverageProbe marks a context.
func TestCoverageProbeMarker(t *testing.T) {
	t.Parallel()
	if isCoverageProbe(context.Background()) || !isCoverageProbe(WithCoverageProbe(context.Background())) {
		t.Fatal("isCoverageProbe does not tell a marked context from an unmarked one")
	}
}
