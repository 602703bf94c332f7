package idemecho

import (
	"slices"

	"github.com/labstack/echo/v4"
)

// Routes lists every route of an echo instance as "METHOD /path", such as
// "POST /accounts/:id/orders", from e.Routes(), sorted: the routes for
// idempotencytest.CheckCoverage, which fills ":id" and "*" with "1". The
// catch-all routes echo registers for a group's middleware (its 404) are
// left out: they run no handler of yours.
func Routes(e *echo.Echo) []string {
	var routes []string
	for _, r := range e.Routes() {
		if r.Method == echo.RouteNotFound {
			continue
		}
		routes = append(routes, r.Method+" "+r.Path)
	}
	slices.Sort(routes)
	return slices.Compact(routes)
}
