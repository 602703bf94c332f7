// Package idemchi names github.com/idemkit/idempotency routes on a chi
// router (github.com/go-chi/chi/v5).
//
// chi needs no adapter: its middleware is func(http.Handler) http.Handler
// and every response goes through the http.ResponseWriter. What it needs is
// a route name: chi sets r.Pattern only after each router has routed, so a
// middleware added with Use sees no pattern (on the root router) or a
// partial one ("/accounts/{id}/*" on a mounted sub-router), and the pattern
// carries no method. RouteName looks the full template up instead.
package idemchi

import (
	"context"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idempotency"
)

// RouteName is a Config.RouteName for chi: the request's method and the
// full template of the route it will be routed to on the root router, such
// as "POST /accounts/{id}/orders", wherever in the router tree the
// middleware runs. It returns "" outside a chi router or when no route
// matches (chi answers 404 or 405), so the middleware falls back to
// r.Pattern, then to "unnamed".
func RouteName(ctx context.Context) string {
	r, ok := idempotency.RequestFromContext(ctx)
	if !ok {
		return ""
	}
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return ""
	}
	pattern := find(rctx.Routes, r)
	if pattern == "" {
		return ""
	}
	return r.Method + " " + pattern
}
