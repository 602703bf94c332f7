package idemchi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/chi"
	"github.com/idemkit/idempotency/idempotencytest"
)

// failures records CheckCoverage's errors instead of failing the test.
type failures struct {
	testing.TB
	errs []string
}

func (f *failures) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *failures) Helper() {}

// coverageRouter is a chi router with a session middleware in front of
// everything, the idempotency middleware on a group, on a mounted
// sub-router and inline, a note route wrapped only when notesWrapped, a
// cancel route and a file server that need no key.
func coverageRouter(t *testing.T, notesWrapped bool) (*chi.Mux, *atomic.Int64) {
	t.Helper()
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{RouteName: idemchi.RouteName})
	if err != nil {
		t.Fatal(err)
	}
	orders := idem.MustRoute(idempotency.RouteConfig{})
	var ran atomic.Int64
	h := func(w http.ResponseWriter, _ *http.Request) { ran.Add(1); w.WriteHeader(http.StatusCreated) }

	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer ok" {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	r.Group(func(r chi.Router) {
		r.Use(orders)
		r.Post("/accounts/{id}/orders", h)
	})
	r.Route("/v2/accounts/{id:[0-9]+}", func(r chi.Router) {
		r.Use(orders)
		r.Post("/transfers", h)
	})
	if notesWrapped {
		r.With(orders).Post("/accounts/{id}/notes", h)
	} else {
		r.Post("/accounts/{id}/notes", h)
	}
	r.Get("/accounts/{id}/orders", h)
	r.Delete("/orders/{id}", h)
	r.Mount("/static", http.FileServer(http.Dir(t.TempDir())))
	return r, &ran
}

var chiExempt = map[string]string{
	"DELETE /orders/{id}": "cancelling twice cancels once",
	"/static/*":           "files, no state",
}

func authenticate(r *http.Request) { r.Header.Set("Authorization", "Bearer ok") }

// TestCheckCoverageChi: Routes lists the router through chi.Walk, and the
// check, behind the session middleware, fails naming the one unwrapped
// POST and passes once it is wrapped; no wrapped handler runs.
func TestCheckCoverageChi(t *testing.T) {
	t.Parallel()
	r, ran := coverageRouter(t, false)
	routes := idemchi.Routes(r)
	for _, want := range []string{"POST /accounts/{id}/orders", "POST /v2/accounts/{id:[0-9]+}/transfers", "POST /accounts/{id}/notes", "PUT /static/*"} {
		if !slices.Contains(routes, want) {
			t.Fatalf("Routes = %q, want it to contain %s", routes, want)
		}
	}
	f := &failures{TB: t}
	idempotencytest.CheckCoverage(f, r, routes, chiExempt, authenticate)
	if len(f.errs) != 1 || !strings.Contains(f.errs[0], "route POST /accounts/{id}/notes ") {
		t.Fatalf("CheckCoverage errors %q, want one naming POST /accounts/{id}/notes", f.errs)
	}
	if ran.Load() != 1 {
		t.Fatalf("handlers ran %d times, want 1 (the unwrapped one)", ran.Load())
	}

	r, ran = coverageRouter(t, true)
	idempotencytest.CheckCoverage(t, r, idemchi.Routes(r), chiExempt, authenticate)
	if ran.Load() != 0 {
		t.Fatalf("handlers ran %d times under the probe of wrapped routes", ran.Load())
	}
}

// TestRefuseUnlistedChi: with Lookup, a keyed POST to a route not listed
// is refused before its handler runs (behind the router's own middleware
// too); listed routes, reads and keyless requests pass.
func TestRefuseUnlistedChi(t *testing.T) {
	t.Parallel()
	r, ran := coverageRouter(t, false)
	h := idempotency.RefuseUnlisted([]string{"POST /accounts/{id}/orders", "POST /v2/accounts/{id:[0-9]+}/transfers"}, idemchi.Lookup(r))(r)
	for _, tc := range []struct {
		method, path, key string
		want              int
		runs              int64
	}{
		{"POST", "/accounts/7/notes", "k-0123456789abcdef", http.StatusBadRequest, 0},
		{"DELETE", "/orders/7", "k-0123456789abcdef", http.StatusBadRequest, 0},
		{"POST", "/accounts/7/notes", "", http.StatusCreated, 1},
		{"GET", "/accounts/7/orders", "k-0123456789abcdef", http.StatusCreated, 1},
		{"POST", "/accounts/7/orders", "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f", http.StatusCreated, 1},
		{"POST", "/v2/accounts/7/transfers", "0d8f7a6e-3b1c-4c2a-9e5f-1a2b3c4d5e6f", http.StatusCreated, 1},
	} {
		ran.Store(0)
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{}`))
		authenticate(req)
		if tc.key != "" {
			req.Header.Set(idempotency.HeaderKey, tc.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want || ran.Load() != tc.runs {
			t.Errorf("%s %s key %q: status %d, handler ran %d times; want %d, %d (body %s)", tc.method, tc.path, tc.key, w.Code, ran.Load(), tc.want, tc.runs, w.Body)
		}
		if tc.want == http.StatusBadRequest && strings.TrimSpace(w.Body.String()) != `{"error":"idempotency_key_unsupported"}` {
			t.Errorf("%s %s: body %s", tc.method, tc.path, w.Body)
		}
	}
}
