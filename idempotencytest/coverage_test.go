package idempotencytest_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
)

// failures is a testing.TB that records CheckCoverage's errors instead of
// failing the test, so a test can assert that the check fails.
type failures struct {
	testing.TB
	errs []string
}

func (f *failures) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *failures) Helper() {}

// check runs CheckCoverage and returns its errors.
func check(t *testing.T, h http.Handler, routes []string, exempt map[string]string, prepare func(*http.Request)) []string {
	t.Helper()
	f := &failures{TB: t}
	idempotencytest.CheckCoverage(f, h, routes, exempt, prepare)
	return f.errs
}

// coverageMux registers routes on a ServeMux, wrapping those in wrapped
// with a real middleware over the memory store, behind a session
// middleware when auth is set (it answers 401 without "Authorization:
// Bearer ok"). It returns the mux and the count of handler runs.
func coverageMux(t *testing.T, routes, wrapped []string, auth bool) (http.Handler, *atomic.Int64) {
	t.Helper()
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wrap := idem.MustRoute(idempotency.RouteConfig{})
	var ran atomic.Int64
	mux := http.NewServeMux()
	for _, route := range routes {
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			ran.Add(1)
			w.WriteHeader(http.StatusCreated)
		})
		if slices.Contains(wrapped, route) {
			h = wrap(h)
		}
		if auth {
			h = session(h)
		}
		mux.Handle(route, h)
	}
	return mux, &ran
}

// session is a session middleware in front of the wrapper.
func session(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer ok" {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func authenticate(r *http.Request) { r.Header.Set("Authorization", "Bearer ok") }

// TestCheckCoverage: the check fails on a mux with an unwrapped POST,
// naming it, and passes once it is wrapped or exempt with a reason; safe
// methods are not probed; path parameters are filled; a wrapped route's
// handler never runs.
func TestCheckCoverage(t *testing.T) {
	t.Parallel()
	routes := []string{"POST /orders", "GET /orders", "PUT /accounts/{id}/limits/{rest...}", "DELETE /orders/{id}", "/legacy/{$}"}
	all := []string{"POST /orders", "PUT /accounts/{id}/limits/{rest...}", "DELETE /orders/{id}", "/legacy/{$}"}
	for _, tc := range []struct {
		name    string
		wrapped []string
		exempt  map[string]string
		want    []string // routes the errors must name, in order
		ran     int64
	}{
		{name: "POST unwrapped", wrapped: all[1:], want: []string{"POST /orders"}, ran: 1},
		{name: "all wrapped", wrapped: all},
		{name: "POST exempt", wrapped: all[1:], exempt: map[string]string{"POST /orders": "test-only route"}},
		{name: "exempt without a reason", wrapped: all[1:], exempt: map[string]string{"POST /orders": " "}, want: []string{"POST /orders"}},
		{name: "exempt route unknown", wrapped: all, exempt: map[string]string{"POST /order": "typo"}, want: []string{"POST /order"}},
		{name: "exempt for every method", wrapped: all[:2], exempt: map[string]string{"/legacy/{$}": "no money", "/orders/{id}": "cancels once"}},
		{name: "parameters and no method", wrapped: all[:1], want: all[1:], ran: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mux, ran := coverageMux(t, routes, tc.wrapped, false)
			errs := check(t, mux, routes, tc.exempt, nil)
			if len(errs) != len(tc.want) {
				t.Fatalf("CheckCoverage reported %d errors, want %d: %q", len(errs), len(tc.want), errs)
			}
			for i, route := range tc.want {
				if !strings.Contains(errs[i], "route "+route+" ") {
					t.Errorf("error %d does not name %s: %s", i, route, errs[i])
				}
			}
			if ran.Load() != tc.ran {
				t.Errorf("handlers ran %d times, want %d (only unwrapped routes run under the probe)", ran.Load(), tc.ran)
			}
		})
	}
}

// TestCheckCoverageBehindSession: with a session middleware in front of
// the wrapper, the probe needs prepare to authenticate it; without, the
// check fails and says why.
func TestCheckCoverageBehindSession(t *testing.T) {
	t.Parallel()
	routes := []string{"POST /orders"}
	mux, ran := coverageMux(t, routes, routes, true)
	if errs := check(t, mux, routes, nil, authenticate); len(errs) != 0 {
		t.Fatalf("an authenticated probe of a wrapped route failed: %q", errs)
	}
	errs := check(t, mux, routes, nil, nil)
	if len(errs) != 1 || !strings.Contains(errs[0], "route POST /orders ") || !strings.Contains(errs[0], "401") || !strings.Contains(errs[0], "prepare") {
		t.Fatalf("an unauthenticated probe: errors %q, want one naming POST /orders, its 401 and prepare", errs)
	}
	if ran.Load() != 0 {
		t.Fatalf("the handler ran %d times", ran.Load())
	}
}

// TestCheckCoverageNoRoutes: an empty route list (a router listed before
// its routes were added, say) fails rather than proves nothing.
func TestCheckCoverageNoRoutes(t *testing.T) {
	t.Parallel()
	if errs := check(t, http.NewServeMux(), nil, nil, nil); len(errs) != 1 {
		t.Fatalf("errors %q, want one", errs)
	}
}

// TestCheckCoverageHandlerPanics: a handler that panics on the probe's
// empty body fails its route, naming it, rather than the whole test.
func TestCheckCoverageHandlerPanics(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(http.ResponseWriter, *http.Request) { panic("no body") })
	errs := check(t, mux, []string{"POST /orders"}, nil, nil)
	if len(errs) != 1 || !strings.Contains(errs[0], "route POST /orders ") || !strings.Contains(errs[0], "panic") {
		t.Fatalf("errors %q, want one naming POST /orders and the panic", errs)
	}
}

// The ServeMux program registers its routes from one table, and its test
// checks the same table.
func ExampleCheckCoverage() {
	idem, _ := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{})
	orders := idem.MustRoute(idempotency.RouteConfig{})
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	cancelOrder := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})

	table := []struct {
		route   string
		handler http.Handler
		exempt  string // why the route needs no key; "" when it is wrapped or safe
	}{
		{"POST /orders", orders(placeOrder), ""},
		{"DELETE /orders/{id}", cancelOrder, "cancelling twice cancels once"},
	}
	mux := http.NewServeMux()
	var routes []string
	exempt := map[string]string{}
	for _, e := range table {
		mux.Handle(e.route, e.handler)
		routes = append(routes, e.route)
		if e.exempt != "" {
			exempt[e.route] = e.exempt
		}
	}

	testCoverage := func(t *testing.T) {
		idempotencytest.CheckCoverage(t, mux, routes, exempt, nil)
	}
	_ = testCoverage // func TestCoverage(t *testing.T) { ... } in your server's tests
}
