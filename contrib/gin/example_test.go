package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
)

// Wrap a gin group with the adapter: c.AbortWithStatusJSON goes through the
// idempotency middleware, so the client, the record and the replay agree.
func ExampleMiddleware() {
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		RouteName: idemgin.RouteName,
	})
	if err != nil {
		panic(err)
	}
	e := gin.New()
	e.Use(gin.Recovery())
	g := e.Group("/accounts/:id", idemgin.Middleware(idem.MustRoute(idempotency.RouteConfig{})))
	g.POST("/orders", func(c *gin.Context) {
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"error": "market closed"})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/accounts/a1/orders", strings.NewReader(`{"qty":1}`))
		req.Header.Set("Idempotency-Key", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 422  {"error":"market closed"}
	// 422 true {"idempotency_replayed":true,"error":"market closed"}
}
