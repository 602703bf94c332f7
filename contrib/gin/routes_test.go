package idemgin_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
	"github.com/idemkit/idempotency/idempotencytest"
)

// failures records CheckCoverage's errors instead of failing the test.
type failures struct {
	testing.TB
	errs []string
}

func (f *failures) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *failures) Helper() {}

// coverageEngine is a gin engine with a session middleware in front, the
// adapted idempotency middleware on a group and inline, a note route
// wrapped only when notesWrapped, and a cancel route that needs no key.
func coverageEngine(t *testing.T, notesWrapped bool) (*gin.Engine, *atomic.Int64) {
	t.Helper()
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{RouteName: idemgin.RouteName})
	if err != nil {
		t.Fatal(err)
	}
	orders := idemgin.Middleware(idem.MustRoute(idempotency.RouteConfig{}))
	var ran atomic.Int64
	h := func(c *gin.Context) { ran.Add(1); c.Status(http.StatusCreated) }

	e := gin.New()
	e.Use(func(c *gin.Context) {
		if c.GetHeader("Authorization") != "Bearer ok" {
			c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{"error": "unauthorized"})
		}
	})
	g := e.Group("/accounts/:id", orders)
	g.POST("/orders", h)
	g.PUT("/files/*path", h)
	if notesWrapped {
		e.POST("/accounts/:id/notes", orders, h)
	} else {
		e.POST("/accounts/:id/notes", h)
	}
	e.GET("/accounts/:id/orders", h)
	e.DELETE("/orders/:id", h)
	return e, &ran
}

// TestCheckCoverageGin: Routes lists the engine, and the check, behind the
// session middleware, fails naming the one unwrapped POST and passes once
// it is wrapped; no wrapped handler runs.
func TestCheckCoverageGin(t *testing.T) {
	t.Parallel()
	exempt := map[string]string{"DELETE /orders/:id": "cancelling twice cancels once"}
	authenticate := func(r *http.Request) { r.Header.Set("Authorization", "Bearer ok") }
	e, ran := coverageEngine(t, false)
	routes := idemgin.Routes(e)
	if !slices.Contains(routes, "PUT /accounts/:id/files/*path") || !slices.Contains(routes, "POST /accounts/:id/notes") {
		t.Fatalf("Routes = %q", routes)
	}
	f := &failures{TB: t}
	idempotencytest.CheckCoverage(f, e, routes, exempt, authenticate)
	if len(f.errs) != 1 || !strings.Contains(f.errs[0], "route POST /accounts/:id/notes ") {
		t.Fatalf("CheckCoverage errors %q, want one naming POST /accounts/:id/notes", f.errs)
	}
	if ran.Load() != 1 {
		t.Fatalf("handlers ran %d times, want 1 (the unwrapped one)", ran.Load())
	}

	e, ran = coverageEngine(t, true)
	idempotencytest.CheckCoverage(t, e, idemgin.Routes(e), exempt, authenticate)
	if ran.Load() != 0 {
		t.Fatalf("handlers ran %d times under the probe of wrapped routes", ran.Load())
	}
}
