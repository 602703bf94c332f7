// Package idemgorilla names github.com/idemkit/idempotency routes on a
// gorilla/mux router (github.com/gorilla/mux).
//
// gorilla/mux needs no adapter: its middleware is
// func(http.Handler) http.Handler, it runs only after a route matched (its
// own 404 and 405 never reach it), and every response goes through the
// http.ResponseWriter. What it needs is a route name: gorilla/mux never
// sets r.Pattern, so without one every route is labelled "unnamed" and
// scoped by its raw path.
package idemgorilla

import (
	"context"

	"github.com/gorilla/mux"

	"github.com/idemkit/idempotency"
)

// RouteName is a Config.RouteName for gorilla/mux: the request's method and
// its route's path template, such as "POST /accounts/{id}/orders" (a
// sub-router's routes carry the full template). It returns "" outside a
// matched gorilla route or for a route without a path template, so the
// middleware falls back to r.Pattern, then to "unnamed".
func RouteName(ctx context.Context) string {
	r, ok := idempotency.RequestFromContext(ctx)
	if !ok {
		return ""
	}
	route := mux.CurrentRoute(r)
	if route == nil {
		return ""
	}
	tmpl, err := route.GetPathTemplate()
	if err != nil {
		return ""
	}
	return r.Method + " " + tmpl
}
