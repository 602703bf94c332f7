package idemchi

import (
	"net/http"
	"slices"

	"github.com/go-chi/chi/v5"
)

// Routes lists every route of a chi router as "METHOD /pattern", such as
// "POST /accounts/{id}/orders", mounted and nested routers included, found
// with chi.Walk and sorted: the routes for idempotencytest.CheckCoverage.
// A route registered with Handle or Mount appears once per method; exempt
// it for every method with its pattern alone ("/static/*").
func Routes(r chi.Routes) []string {
	var routes []string
	_ = chi.Walk(r, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		routes = append(routes, method+" "+route)
		return nil
	})
	slices.Sort(routes)
	return slices.Compact(routes)
}

// Lookup returns idempotency.RefuseUnlisted's lookup for a chi router: the
// full template of the route a request will be routed to, such as
// "/accounts/{id}/orders" (chi's templates carry no method), or "" when
// none matches.
func Lookup(r chi.Routes) func(*http.Request) string {
	return func(req *http.Request) string { return find(r, req) }
}

// find is the full template of the route r routes req to, or "".
func find(r chi.Routes, req *http.Request) string {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	if path == "" {
		path = "/"
	}
	// Find updates the context it is given: use a fresh one.
	return r.Find(chi.NewRouteContext(), req.Method, path)
}
