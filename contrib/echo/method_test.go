package idemecho_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/echo"
	"github.com/idemkit/idempotency/internal/routertest"
)

// TestEchoGroupWrongMethod: with the docs/frameworks.md recipe (the middleware on a
// group), a wrong method is echo's 404, not 405: the group's catch-all
// route wins. On e.Use it is 405 (TestEchoGlobalUse). Neither is claimed.
func TestEchoGroupWrongMethod(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemecho.RouteName})
	e := newEcho()
	g := e.Group("/accounts/:id", idemecho.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})))
	g.POST("/orders", created)
	srv := start(t, e)
	if got := routertest.Send(t, srv, "PUT", "/accounts/a1/orders", routertest.Key(), `{}`); got.Status != http.StatusNotFound {
		t.Errorf("PUT answered %d, want echo's 404", got.Status)
	}
	if n := kit.Rows(t); n != 0 {
		t.Errorf("echo's own answer was claimed (%d rows)", n)
	}
}
