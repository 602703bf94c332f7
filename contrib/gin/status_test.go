package idemgin_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
	"github.com/idemkit/idempotency/internal/routertest"
)

// sendOnce is routertest.Send without following redirects: a 303 must be
// seen as the 303 it is.
func sendOnce(t *testing.T, srv *httptest.Server, path, key string) routertest.Seen {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+path, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idempotency.HeaderKey, key)
	client := &http.Client{Transport: srv.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", path, err)
	}
	return routertest.Seen{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// TestGinStatusOnly: answers with a status and no body (c.Status,
// c.Redirect on a POST, which writes no body) reach the client, the record
// and the replay as that status, not as gin's default 200: a 502 fails the
// key, a 429 gives it back, and an outer middleware sees the status sent.
// Found by a review: gin's writer only notes such a status, and gin sends
// it after the chain returned, past the middleware, which had recorded 200.
func TestGinStatusOnly(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemgin.RouteName})
	var calls atomic.Int64
	e := gin.New()
	e.Use(recovery())
	var outer atomic.Int64
	e.Use(func(c *gin.Context) { c.Next(); outer.Store(int64(c.Writer.Status())) })
	g := e.Group("/", idemgin.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})), func(*gin.Context) { calls.Add(1) })
	g.POST("/no-content", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	g.POST("/created", func(c *gin.Context) { c.Header("Location", "/orders/7"); c.Status(http.StatusCreated) })
	g.POST("/see-other", func(c *gin.Context) { c.Redirect(http.StatusSeeOther, "/orders/7") })
	g.POST("/bad-gateway", func(c *gin.Context) { c.Status(http.StatusBadGateway) })
	g.POST("/too-many", func(c *gin.Context) { c.Status(http.StatusTooManyRequests) })
	srv := start(t, e)

	for _, c := range []struct {
		path   string
		status int
	}{
		{"/no-content", http.StatusNoContent},
		{"/created", http.StatusCreated},
		{"/see-other", http.StatusSeeOther},
	} {
		key := routertest.Key()
		first := sendOnce(t, srv, c.path, key)
		rec := kit.Record(t, key)
		replay := sendOnce(t, srv, c.path, key)
		if first.Status != c.status || rec.Response.Status != c.status || replay.Status != c.status {
			t.Errorf("%s: client %d, recorded %d, replayed %d; want %d each", c.path, first.Status, rec.Response.Status, replay.Status, c.status)
			continue
		}
		routertest.SawRecorded(t, first, rec)
		routertest.Replayed(t, replay, rec)
		if got := outer.Load(); got != int64(c.status) {
			t.Errorf("%s: an outer middleware saw %d", c.path, got)
		}
	}
	if got := kit.Record(t, sendKey(t, srv, "/see-other")).Response.Header.Get("Location"); got != "/orders/7" {
		t.Errorf("303 recorded Location %q", got)
	}

	// A status-only 502 is a failure: recorded failed, never a success.
	key := routertest.Key()
	if got := sendOnce(t, srv, "/bad-gateway", key); got.Status != http.StatusBadGateway {
		t.Errorf("c.Status(502): the client got %d", got.Status)
	}
	if rec := kit.Record(t, key); rec.Status != idempotency.StatusFailed {
		t.Errorf("c.Status(502) recorded %s with status %d, want failed", rec.Status, rec.Response.Status)
	} else if again := sendOnce(t, srv, "/bad-gateway", key); again.Status != http.StatusConflict || !bytes.Contains(again.Body, []byte("idempotency_previous_failed")) {
		t.Errorf("retry after c.Status(502): %d %q, want 409 idempotency_previous_failed", again.Status, again.Body)
	}

	// A status-only 429 gives the key back: the retry executes again.
	key = routertest.Key()
	before := calls.Load()
	for i := range 2 {
		if got := sendOnce(t, srv, "/too-many", key); got.Status != http.StatusTooManyRequests || got.Header.Get(idempotency.HeaderReplayed) != "" {
			t.Errorf("c.Status(429), attempt %d: %d (replayed %q), want a fresh 429", i+1, got.Status, got.Header.Get(idempotency.HeaderReplayed))
		}
	}
	if n := calls.Load() - before; n != 2 {
		t.Errorf("c.Status(429) twice with one key: the handler ran %d times, want 2 (the key is released)", n)
	}
}

// sendKey sends one request with a fresh key and returns the key.
func sendKey(t *testing.T, srv *httptest.Server, path string) string {
	t.Helper()
	key := routertest.Key()
	sendOnce(t, srv, path, key)
	return key
}
