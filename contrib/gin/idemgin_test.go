package idemgin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/idemkit/idempotency/internal/testdb"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	os.Exit(testdb.Main(m).Run()) // stops the Postgres container testdb may have started
}

func created(c *gin.Context) {
	if _, ok := idempotency.KeyFromContext(c.Request.Context()); !ok && c.GetHeader(idempotency.HeaderKey) != "" {
		c.AbortWithStatus(http.StatusInternalServerError) // the key must reach the handler
		return
	}
	c.Header("Location", c.Request.URL.Path+"/7")
	c.JSON(http.StatusCreated, gin.H{"id": 7, "account": c.Param("id")})
}

func recovery() gin.HandlerFunc { return gin.RecoveryWithWriter(io.Discard) }

func start(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// TestGin drives the docs/frameworks.md recipe on a real server: Recovery outside, the
// adapted middleware on a group, c.AbortWithStatus and
// c.AbortWithStatusJSON, panics recovered outside and inside, a replay that
// must not run the handler again, and gin's own 404 and 405.
func TestGin(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemgin.RouteName})
	orders := idemgin.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{}))
	var calls atomic.Int64
	count := func(c *gin.Context) { calls.Add(1) }

	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(recovery())
	// An outer middleware, like a logger, sees the status the client got
	// and a live request context.
	var outer atomic.Value
	e.Use(func(c *gin.Context) {
		c.Next()
		outer.Store(fmt.Sprint(c.Writer.Status(), " ", c.Request.Context().Err()))
	})
	g := e.Group("/accounts/:id", orders, count)
	g.POST("/orders", created)
	g.POST("/aborts", func(c *gin.Context) { c.AbortWithStatus(http.StatusConflict) })
	g.POST("/aborts-json", func(c *gin.Context) {
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"error": "market closed"})
	})
	g.POST("/aborts-500", func(c *gin.Context) { c.AbortWithStatus(http.StatusBadGateway) })
	g.POST("/panics", func(*gin.Context) { panic("boom") })
	e.POST("/v2/accounts/:id/panics-inside", orders, recovery(), func(*gin.Context) { panic("boom") })
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
	if n := calls.Load(); n != 3 {
		t.Errorf("the handlers ran %d times for two keys and one unkeyed request", n)
	}
	// Abort puts its status through the recorder: the client sees it only
	// after it is recorded, and the replay is the same.
	if _, _, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/aborts", `{}`); first.Status != http.StatusConflict {
		t.Errorf("AbortWithStatus: %d", first.Status)
	}
	_, rec, first = kit.RoundTrip(t, srv, "POST", "/accounts/a1/aborts-json", `{}`)
	if first.Status != http.StatusUnprocessableEntity || string(rec.Response.Body) != `{"error":"market closed"}` {
		t.Errorf("AbortWithStatusJSON: client %d, recorded %q", first.Status, rec.Response.Body)
	}

	for _, c := range []struct {
		path   string
		status int
	}{
		{"/accounts/a1/aborts-500", http.StatusBadGateway},
		{"/accounts/a1/panics", http.StatusInternalServerError},
		{"/v2/accounts/a1/panics-inside", http.StatusInternalServerError},
	} {
		key := routertest.Key()
		if got := routertest.Send(t, srv, "POST", c.path, key, `{}`); got.Status != c.status {
			t.Errorf("%s: %d, want %d", c.path, got.Status, c.status)
		}
		kit.Failed(t, srv, "POST", c.path, key, `{}`)
	}

	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/nowhere", http.StatusNotFound},
		{"POST", "/accounts/a1/nowhere", http.StatusNotFound},
		{"PUT", "/accounts/a1/orders", http.StatusMethodNotAllowed},
	} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: gin's own answer was recorded", c.method, c.path)
		}
	}
}

// TestGinEngineUse: engine-wide, the middleware also sees gin's 404 and
// 405 (gin writes them after the chain returns): they pass through
// unclaimed, so a keyed request to a missing route is never answered 200.
func TestGinEngineUse(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemgin.RouteName})
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(idemgin.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})))
	e.POST("/accounts/:id/orders", created)
	srv := start(t, e)

	if _, rec, _ := kit.RoundTrip(t, srv, "POST", "/accounts/a1/orders", `{}`); rec.Endpoint != "POST /accounts/:id/orders" {
		t.Errorf("endpoint %q", rec.Endpoint)
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
			t.Errorf("%s %s: gin's own answer was recorded", c.method, c.path)
		}
	}
}

// naive is the usual adapter: only Header, Write and WriteHeader go to the
// idempotency middleware's writer.
type naive struct {
	gin.ResponseWriter
	w http.ResponseWriter
}

func (n naive) Header() http.Header         { return n.w.Header() }
func (n naive) Write(b []byte) (int, error) { return n.w.Write(b) }
func (n naive) WriteHeader(code int)        { n.w.WriteHeader(code) }

// TestNaiveAdapterIsNotEnough pins why the adapter exists: with the usual
// adapter, AbortWithStatus sends gin's default 200 on the wire while 409 is
// recorded and replayed.
func TestNaiveAdapterIsNotEnough(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{})
	mw := kit.MW.MustRoute(idempotency.RouteConfig{})
	e := gin.New()
	e.POST("/aborts", func(c *gin.Context) {
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.Request = r
			c.Writer = naive{ResponseWriter: c.Writer, w: w}
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
	}, func(c *gin.Context) { c.AbortWithStatus(http.StatusConflict) })
	srv := start(t, e)

	key := routertest.Key()
	first := routertest.Send(t, srv, "POST", "/aborts", key, `{}`)
	rec := kit.Record(t, key)
	if first.Status != http.StatusOK || rec.Response.Status != http.StatusConflict {
		t.Fatalf("client %d, recorded %d; the adapter may no longer be needed", first.Status, rec.Response.Status)
	}
}

// TestRouteNameOutsideGin: no adapter, no name.
func TestRouteNameOutsideGin(t *testing.T) {
	t.Parallel()
	if got := routertest.RouteNameOf(t, idemgin.RouteName, httptest.NewRequest("POST", "/x", nil)); got != "" {
		t.Fatalf("RouteName = %q outside gin", got)
	}
}
