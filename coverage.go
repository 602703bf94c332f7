package idempotency

import (
	"context"
	"net/http"
	"strings"
)

// Proof that every money route is covered: a coverage probe that a wrapped
// route answers without claiming or running anything (the check lives in
// idempotencytest.CheckCoverage), and a middleware that refuses a key sent
// to a route nobody wrapped, so a forgotten wrapper fails loudly instead
// of answering 201 with retry-safety it does not have.

type probeKey struct{}

// probeHeader and probeWrapped are what a wrapped route answers a probe
// with. They are not part of the client's contract: only a request whose
// context was marked in-process ever sees them.
const (
	probeHeader  = "Idempotency-Probe"
	probeWrapped = "wrapped"
)

// WithCoverageProbe marks ctx's request as a coverage probe (see
// idempotencytest.CheckCoverage): a route wrapped by Middleware.Route
// answers it 204 with "Idempotency-Probe: wrapped", claims no key and runs
// no handler. No header can set the marker, so clients cannot probe.
func WithCoverageProbe(ctx context.Context) context.Context {
	return context.WithValue(ctx, probeKey{}, true)
}

// isCoverageProbe reports whether ctx carries WithCoverageProbe's marker.
func isCoverageProbe(ctx context.Context) bool {
	probe, _ := ctx.Value(probeKey{}).(bool)
	return probe
}

// answerProbe answers a coverage probe if r is one, before any claim or
// handler: the wrapper is there, which is all the probe asks. It is not
// one of the contract's answers (answers.go): no client can send it, so it
// counts no metric.
func answerProbe(w http.ResponseWriter, r *http.Request) bool {
	if !isCoverageProbe(r.Context()) {
		return false
	}
	w.Header().Set(probeHeader, probeWrapped)
	w.WriteHeader(http.StatusNoContent)
	return true
}

// unsupportedBody is RefuseUnlisted's answer body.
const unsupportedBody = `{"error":"idempotency_key_unsupported"}` + "\n"

// RefuseUnlisted returns a router-wide middleware that answers 400
// idempotency_key_unsupported, before any handler, to a keyed request (or a
// coverage probe) with an unsafe method (not GET, HEAD, OPTIONS, TRACE,
// QUERY) whose route is not in wrapped ("METHOD /pattern", or "/pattern" for
// every method). lookup returns r's route pattern, "" for none (r passes);
// for chi, idemchi.Lookup. It panics when lookup is nil.
func RefuseUnlisted(wrapped []string, lookup func(*http.Request) string) func(http.Handler) http.Handler {
	if lookup == nil {
		panic("idempotency: RefuseUnlisted needs a lookup of the request's route")
	}
	listed := make(map[string]bool, len(wrapped))
	for _, route := range wrapped {
		method, path := splitRoute(route)
		listed[method+" "+path] = true
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if unlisted(r, listed, lookup) {
				h := w.Header()
				h.Set("Content-Type", "application/json")
				h.Set("Cache-Control", "no-store")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(unsupportedBody))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// unlisted reports whether r must be refused: keyed (or a probe), a method
// that is not safe, and a route that matched but is listed neither with
// its method ("POST /orders") nor for every method ("/orders"). A pattern
// without a method (chi's, or a ServeMux pattern for every method) takes
// the request's.
func unlisted(r *http.Request, listed map[string]bool, lookup func(*http.Request) string) bool {
	if len(r.Header[HeaderKey]) == 0 && !isCoverageProbe(r.Context()) {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "QUERY":
		return false
	}
	pattern := lookup(r)
	if pattern == "" {
		return false
	}
	method, path := splitRoute(pattern)
	if method == "" {
		method = r.Method
	}
	return !listed[method+" "+path] && !listed[" "+path]
}

// splitRoute splits "METHOD /pattern" into its method and pattern, as
// ServeMux reads it (a space or a tab after the method); the method is ""
// when the route has none.
func splitRoute(route string) (method, pattern string) {
	route = strings.TrimSpace(route)
	i := strings.IndexAny(route, " \t")
	if i < 0 {
		return "", route
	}
	return route[:i], strings.TrimLeft(route[i:], " \t")
}
