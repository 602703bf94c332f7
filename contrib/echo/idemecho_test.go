package idemecho_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/echo"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

func created(c echo.Context) error {
	if _, ok := idempotency.KeyFromContext(c.Request().Context()); !ok && c.Request().Header.Get(idempotency.HeaderKey) != "" {
		return errors.New("the key did not reach the handler")
	}
	c.Response().Header().Set("Location", c.Request().URL.Path+"/7")
	return c.JSON(http.StatusCreated, map[string]any{"id": 7, "account": c.Param("id")})
}

func rejected(echo.Context) error {
	return echo.NewHTTPError(http.StatusBadRequest, "quantity must be positive")
}

func conflict(c echo.Context) error {
	return c.JSON(http.StatusConflict, map[string]string{"error": "insufficient funds"})
}

func brokerDown(echo.Context) error { return errors.New("broker down") }

func panics(echo.Context) error { panic("boom") }

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

// quietRecover is echo's Recover middleware without the stack in the log.
func quietRecover() echo.MiddlewareFunc {
	return middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true})
}

func start(t *testing.T, e *echo.Echo) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

// TestEcho drives the docs/frameworks.md recipe on a real server: Recover outside, the
// adapted middleware on a group, returned errors (an HTTPError, a plain
// error), a handler's own 409, panics recovered outside and inside, and
// echo's own 404 and 405.
func TestEcho(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemecho.RouteName})
	orders := idemecho.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{}))

	e := newEcho()
	e.Use(quietRecover())
	// An outer middleware, like a logger, sees the status the client got
	// and a live request context.
	var outer atomic.Value
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			outer.Store(fmt.Sprint(c.Response().Status, " ", c.Request().Context().Err()))
			return err
		}
	})
	g := e.Group("/accounts/:id", orders)
	g.POST("/orders", created)
	g.POST("/rejects", rejected)
	g.POST("/conflicts", conflict)
	g.POST("/fails", brokerDown)
	g.POST("/panics", panics)
	e.POST("/accounts/:id/panics-inside", panics, orders, quietRecover())
	e.POST("/v2/orders", created, orders)
	srv := start(t, e)

	_, rec, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/orders", `{"qty":1}`)
	if first.Status != http.StatusCreated || rec.Endpoint != "POST /accounts/:id/orders" {
		t.Errorf("status %d endpoint %q", first.Status, rec.Endpoint)
	}
	routertest.Send(t, srv, "POST", "/accounts/a1/orders", routertest.Key(), `{}`) // a miss: the handler ran
	if got := outer.Load(); got != "201 <nil>" {
		t.Errorf("an outer middleware saw %q, want 201 and a live context", got)
	}
	// Without a key: passed through, nothing recorded.
	if before, got := kit.Rows(t), routertest.Send(t, srv, "POST", "/accounts/a1/orders", "", `{}`); got.Status != http.StatusCreated || string(got.Body) == "" || kit.Rows(t) != before {
		t.Errorf("unkeyed: %d %q, rows %d -> %d", got.Status, got.Body, before, kit.Rows(t))
	}
	// A returned HTTPError is rendered inside the middleware: recorded and
	// replayed as the client saw it, never as 200 with an empty body.
	_, rec, first = kit.RoundTrip(t, srv, "POST", "/accounts/a1/rejects", `{"qty":0}`)
	if first.Status != http.StatusBadRequest || string(rec.Response.Body) != `{"message":"quantity must be positive"}`+"\n" {
		t.Errorf("returned HTTPError: client %d, recorded %d %q", first.Status, rec.Response.Status, rec.Response.Body)
	}
	if _, _, first = kit.RoundTrip(t, srv, "POST", "/accounts/a1/conflicts", `{}`); first.Status != http.StatusConflict {
		t.Errorf("a handler's 409: %d", first.Status)
	}

	// A plain returned error is echo's 500: the key is failed (a
	// transactional route rolls back), and the client saw that 500.
	for _, path := range []string{"/accounts/a1/fails", "/accounts/a1/panics", "/accounts/a1/panics-inside"} {
		key := routertest.Key()
		got := routertest.Send(t, srv, "POST", path, key, `{}`)
		if got.Status != http.StatusInternalServerError || string(got.Body) != `{"message":"Internal Server Error"}`+"\n" {
			t.Errorf("%s: %d %q, want echo's 500", path, got.Status, got.Body)
		}
		kit.Failed(t, srv, "POST", path, key, `{}`)
	}

	// echo's own answers pass through unclaimed.
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/nowhere", http.StatusNotFound},
		{"POST", "/accounts/a1/nowhere", http.StatusNotFound},
		{"PUT", "/accounts/a1/panics-inside", http.StatusNotFound}, // echo: a group's catch-all 404 wins over 405
		{"PUT", "/v2/orders", http.StatusMethodNotAllowed},
	} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: echo's own answer was recorded", c.method, c.path)
		}
	}
}

// TestEchoGlobalUse: with e.Use the middleware runs for every request after
// routing, echo's own 404 and 405 included; those pass through unclaimed.
func TestEchoGlobalUse(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemecho.RouteName})
	e := newEcho()
	e.Use(idemecho.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})))
	e.POST("/accounts/:id/orders", created)
	e.POST("/accounts/:id/rejects", rejected)
	srv := start(t, e)

	if _, rec, _ := kit.RoundTrip(t, srv, "POST", "/accounts/a1/orders", `{}`); rec.Endpoint != "POST /accounts/:id/orders" {
		t.Errorf("endpoint %q", rec.Endpoint)
	}
	if _, _, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/rejects", `{}`); first.Status != http.StatusBadRequest {
		t.Errorf("returned HTTPError: %d", first.Status)
	}
	for _, c := range []struct {
		method, path string
		status       int
	}{{"POST", "/nowhere", http.StatusNotFound}, {"PUT", "/accounts/a1/orders", http.StatusMethodNotAllowed}} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: echo's own answer was recorded", c.method, c.path)
		}
	}
}

// TestWrapMiddlewareIsNotEnough pins why the adapter exists: with plain
// echo.WrapMiddleware a returned error is answered, recorded and replayed as
// 200 with an empty body (echo does not render an error once the response
// is committed), and a Recover outside writes its 500 into the finished
// recorder, so the client gets an empty 200 for a panic.
func TestWrapMiddlewareIsNotEnough(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{})
	e := newEcho()
	e.Use(quietRecover())
	plain := echo.WrapMiddleware(kit.MW.MustRoute(idempotency.RouteConfig{}))
	e.POST("/rejects", rejected, plain)
	e.POST("/panics", panics, plain)
	srv := start(t, e)

	key := routertest.Key()
	first := routertest.Send(t, srv, "POST", "/rejects", key, `{}`)
	rec := kit.Record(t, key)
	if rec.Response.Status != http.StatusOK || len(rec.Response.Body) != 0 {
		t.Fatalf("plain WrapMiddleware recorded %d %q; the adapter may no longer be needed", rec.Response.Status, rec.Response.Body)
	}
	// The recorder's 200 went out first, so echo skipped rendering the
	// error: the client was told its rejected request succeeded.
	if first.Status != http.StatusOK || len(first.Body) != 0 {
		t.Fatalf("the client saw %d %q", first.Status, first.Body)
	}
	if got := routertest.Send(t, srv, "POST", "/panics", routertest.Key(), `{}`); got.Status != http.StatusOK || len(got.Body) != 0 {
		t.Fatalf("a panic under plain WrapMiddleware answered %d %q", got.Status, got.Body)
	}
}

// TestRouteNameOutsideEcho: no adapter, no name.
func TestRouteNameOutsideEcho(t *testing.T) {
	t.Parallel()
	if got := routertest.RouteNameOf(t, idemecho.RouteName, httptest.NewRequest("POST", "/x", nil)); got != "" {
		t.Fatalf("RouteName = %q outside echo", got)
	}
}
