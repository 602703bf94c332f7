package idempotencytest

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
)

// CheckCoverage fails t for every route of h that changes state and is
// neither wrapped by the idempotency middleware nor exempt, naming the
// route: the proof, for a payment review, that no money route was
// forgotten.
//
// routes lists h's routes as "METHOD /pattern" (or "/pattern" for every
// method): the table a ServeMux program registers its routes from, or, for
// chi, gin and echo, the list their contrib modules' Routes return. Routes
// with a safe method (GET, HEAD, OPTIONS, TRACE, QUERY) are skipped. For
// each other route, CheckCoverage sends h one request through the whole
// router: the method (POST for a route without one), the pattern with
// every path parameter filled with "1" ("/orders/{id}" and
// "/orders/:id" become "/orders/1"), no body, prepared by prepare (for
// example, to pass the session middleware in front of the wrapper; nil
// for none), and carrying idempotency.WithCoverageProbe's marker. A
// wrapped route answers 204 with "Idempotency-Probe: wrapped" and neither
// claims a key nor runs its handler; any other answer fails the route.
// The handler of a route that is not wrapped does run, once, with an
// empty body: check against a test instance.
//
// exempt maps routes (as in routes) that need no key to the reason why,
// such as "DELETE /orders/{id}": "already idempotent"; a pattern without a
// method ("/static/*") exempts it for every method. An exemption without
// a reason, or for a route not in routes, fails t, as does an empty
// list of routes.
func CheckCoverage(t testing.TB, h http.Handler, routes []string, exempt map[string]string, prepare func(*http.Request)) {
	t.Helper()
	if len(routes) == 0 {
		t.Errorf("coverage: no routes to check (is the router's route list empty?)")
	}
	listed := make(map[string]bool, 2*len(routes))
	for _, route := range routes {
		_, pattern := splitRoute(route)
		listed[normalRoute(route)], listed[" "+pattern] = true, true
	}
	exempted := make(map[string]bool, len(exempt))
	for _, route := range slices.Sorted(maps.Keys(exempt)) {
		exempted[normalRoute(route)] = true
		if strings.TrimSpace(exempt[route]) == "" {
			t.Errorf("coverage: route %s is exempt without a reason: say why it needs no idempotency key", route)
		}
		if !listed[normalRoute(route)] {
			t.Errorf("coverage: exempt route %s is not among the routes checked (renamed or removed?)", route)
		}
	}
	for _, route := range routes {
		method, pattern := splitRoute(route)
		if exempted[normalRoute(route)] || exempted[" "+pattern] || safeMethod(method) {
			continue
		}
		if msg := probe(t, h, route, prepare); msg != "" {
			t.Errorf("coverage: route %s is not shown to be wrapped by the idempotency middleware: %s; wrap it, or exempt it with a reason", route, msg)
		}
	}
}

// probe sends route's coverage probe through h and returns what was wrong
// with the answer, or "" when the route is wrapped.
func probe(t testing.TB, h http.Handler, route string, prepare func(*http.Request)) (msg string) {
	method, pattern := splitRoute(route)
	host, target := fillPattern(pattern)
	r := httptest.NewRequestWithContext(t.Context(), cmp.Or(method, http.MethodPost), target, http.NoBody)
	if host != "" {
		r.Host = host
	}
	if prepare != nil {
		prepare(r)
	}
	r = r.WithContext(idempotency.WithCoverageProbe(r.Context()))
	w := httptest.NewRecorder()
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprintf("the probe %s %s made the handler panic (%v)", r.Method, target, p)
		}
	}()
	h.ServeHTTP(w, r)
	if w.Code == http.StatusNoContent && w.Header().Get("Idempotency-Probe") == "wrapped" {
		return ""
	}
	msg = fmt.Sprintf("the probe %s %s got %d %.120q, want 204 with Idempotency-Probe: wrapped", r.Method, target, w.Code, w.Body.String())
	if w.Code == http.StatusUnauthorized || w.Code == http.StatusForbidden {
		msg += " (did prepare authenticate the probe?)"
	}
	return msg
}

// fillPattern returns a request target for a route pattern, every path
// parameter filled with "1": ServeMux's and chi's "{id}", "{path...}",
// "{id:[0-9]+}" (and "{$}", which ends the path), gin's and echo's ":id"
// and "*path", chi's "*". A ServeMux host ("example.com/x") is split off.
func fillPattern(pattern string) (host, target string) {
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		host, pattern = pattern[:i], pattern[i:]
	}
	segs := strings.Split(pattern, "/")
	for i, seg := range segs {
		switch {
		case strings.HasPrefix(seg, ":"), strings.HasPrefix(seg, "*"):
			segs[i] = "1"
		default:
			segs[i] = fillBraces(seg)
		}
	}
	return host, cmp.Or(strings.Join(segs, "/"), "/")
}

// fillBraces replaces each "{...}" of a path segment (nested braces of a
// chi regexp included) with "1", and "{$}" with nothing.
func fillBraces(seg string) string {
	var b strings.Builder
	depth, start := 0, 0
	for i := 0; i < len(seg); i++ {
		switch c := seg[i]; {
		case c == '{':
			if depth == 0 {
				start = i
			}
			depth++
		case c == '}' && depth > 0:
			depth--
			if depth == 0 && seg[start:i+1] != "{$}" {
				b.WriteByte('1')
			}
		case depth == 0:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// splitRoute splits "METHOD /pattern" into its method ("" when the route
// has none) and pattern, as ServeMux reads it.
func splitRoute(route string) (method, pattern string) {
	route = strings.TrimSpace(route)
	i := strings.IndexAny(route, " \t")
	if i < 0 {
		return "", route
	}
	return route[:i], strings.TrimLeft(route[i:], " \t")
}

// normalRoute writes a route one way, whatever its spacing.
func normalRoute(route string) string {
	method, pattern := splitRoute(route)
	return method + " " + pattern
}

// safeMethod reports whether method never changes state, by HTTP's
// definition (QUERY included): such routes need no key.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "QUERY":
		return true
	}
	return false
}
