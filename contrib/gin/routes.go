package idemgin

import (
	"slices"

	"github.com/gin-gonic/gin"
)

// Routes lists every route of a gin engine as "METHOD /path", such as
// "POST /accounts/:id/orders", from engine.Routes(), sorted: the routes
// for idempotencytest.CheckCoverage, which fills ":id" and "*path" with
// "1".
func Routes(e *gin.Engine) []string {
	var routes []string
	for _, r := range e.Routes() {
		routes = append(routes, r.Method+" "+r.Path)
	}
	slices.Sort(routes)
	return slices.Compact(routes)
}
