package idemgin_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
	"github.com/idemkit/idempotency/internal/routertest"
)

// TestGinGroupWrongMethod: with the docs/frameworks.md recipe (gin.New(), the
// middleware on a group), a wrong method is gin's 404: gin answers 405
// only with engine.HandleMethodNotAllowed set. Neither is claimed.
func TestGinGroupWrongMethod(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		handle405 bool
		status    int
	}{{false, http.StatusNotFound}, {true, http.StatusMethodNotAllowed}} {
		kit := routertest.New(t, idempotency.Config{RouteName: idemgin.RouteName})
		r := gin.New()
		r.HandleMethodNotAllowed = c.handle405
		g := r.Group("/accounts/:id", idemgin.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})))
		g.POST("/orders", created)
		srv := start(t, r)
		if got := routertest.Send(t, srv, "PUT", "/accounts/a1/orders", routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("HandleMethodNotAllowed %v: PUT answered %d, want %d", c.handle405, got.Status, c.status)
		}
		if n := kit.Rows(t); n != 0 {
			t.Errorf("HandleMethodNotAllowed %v: gin's own answer was claimed (%d rows)", c.handle405, n)
		}
	}
}
