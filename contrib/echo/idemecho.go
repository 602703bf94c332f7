// Package idemecho adapts github.com/idemkit/idempotency to echo v4
// (github.com/labstack/echo/v4).
//
// echo.WrapMiddleware is not enough. An echo handler that returns an error
// (idiomatic echo) writes nothing inside the wrapped middleware; echo
// renders the error after the middleware has finished. The middleware
// would record, and every retry replay, 200 with an empty body while the
// first client saw the error; a transactional route would commit the
// handler's partial writes. A recovery middleware outside the wrapper
// writes its 500 into the finished recorder, so the client gets an empty
// 200. Middleware renders a returned error inside the idempotency
// middleware, through echo's HTTPErrorHandler, so it is recorded (and a
// 5xx fails the key and rolls a transaction back) like any response, and
// restores echo's own response and request afterwards.
package idemecho

import (
	"context"
	"net/http"
	"reflect"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idempotency"
)

type pathKey struct{}

// Middleware adapts one route's idempotency middleware (from
// Middleware.Route or MustRoute) to echo: use it with e.Use, g.Use or as a
// route's middleware. A handler's returned error is rendered by
// c.Error (echo's HTTPErrorHandler) inside the idempotency middleware, so
// the client, the record and every replay agree; the adapted middleware
// itself returns nil. echo's own 404 and 405 (no route matched) pass
// through unclaimed.
func Middleware(mw func(http.Handler) http.Handler) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		// A group's middleware wraps echo's NotFoundHandler itself (Group.Use
		// registers it as the group's catch-all route).
		nextUnrouted := isEchoHandler(next)
		return func(c echo.Context) error {
			if nextUnrouted || isEchoHandler(c.Handler()) {
				return next(c)
			}
			orig, origReq := c.Response(), c.Request()
			// Restored even when the handler panics, so a recovery
			// middleware outside writes to the client, not the recorder,
			// and middlewares outside never see the handler's context,
			// whose deadline is cancelled once the handler returns.
			defer func() { c.SetResponse(orig); c.SetRequest(origReq) }()
			r := origReq.WithContext(context.WithValue(origReq.Context(), pathKey{}, c.Path()))
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				if err := next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(orig, r)
			return nil
		}
	}
}

var (
	notFound         = reflect.ValueOf(echo.NotFoundHandler).Pointer()
	methodNotAllowed = reflect.ValueOf(echo.MethodNotAllowedHandler).Pointer()
)

// isEchoHandler reports whether h is echo's NotFoundHandler or
// MethodNotAllowedHandler: the router found no route for the request.
func isEchoHandler(h echo.HandlerFunc) bool {
	if h == nil {
		return true
	}
	p := reflect.ValueOf(h).Pointer()
	return p == notFound || p == methodNotAllowed
}

// RouteName is a Config.RouteName for echo: the request's method and its
// route's path as registered, such as "POST /accounts/:id/orders". It
// answers only inside Middleware (echo's path is on its Context, not the
// request), and "" elsewhere, so the middleware falls back to r.Pattern,
// then to "unnamed".
func RouteName(ctx context.Context) string {
	r, ok := idempotency.RequestFromContext(ctx)
	if !ok {
		return ""
	}
	p, _ := r.Context().Value(pathKey{}).(string)
	if p == "" {
		return ""
	}
	return r.Method + " " + p
}
