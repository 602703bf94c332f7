package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/echo"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Wrap an echo group with the adapter: a handler's returned error is
// rendered inside the idempotency middleware, so the client, the record
// and the replay agree on it.
func ExampleMiddleware() {
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		RouteName: idemecho.RouteName,
	})
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(middleware.Recover())
	g := e.Group("/accounts/:id", idemecho.Middleware(idem.MustRoute(idempotency.RouteConfig{})))
	g.POST("/orders", func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "market closed")
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/accounts/a1/orders", strings.NewReader(`{"qty":1}`))
		req.Header.Set("Idempotency-Key", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	// Output:
	// 422  {"message":"market closed"}
	// 422 true {"idempotency_replayed":true,"message":"market closed"}
}
