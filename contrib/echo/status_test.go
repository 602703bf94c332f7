package idemecho_test

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

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/echo"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/labstack/echo/v4"
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

// TestEchoStatusOnly: answers with a status and no body (c.NoContent,
// c.Redirect) reach the client, the record and the replay as that status;
// a 502 fails the key and a 429 gives it back. echo's Response sends the
// status when it is set, inside the middleware, so the adapter needs
// nothing more for them (checked beside gin's fix, which did).
func TestEchoStatusOnly(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemecho.RouteName})
	var calls atomic.Int64
	e := newEcho()
	g := e.Group("", idemecho.Middleware(kit.MW.MustRoute(idempotency.RouteConfig{})), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { calls.Add(1); return next(c) }
	})
	g.POST("/no-content", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	g.POST("/see-other", func(c echo.Context) error { return c.Redirect(http.StatusSeeOther, "/orders/7") })
	g.POST("/bad-gateway", func(c echo.Context) error { return c.NoContent(http.StatusBadGateway) })
	g.POST("/too-many", func(c echo.Context) error { return c.NoContent(http.StatusTooManyRequests) })
	srv := start(t, e)

	for _, c := range []struct {
		path   string
		status int
	}{{"/no-content", http.StatusNoContent}, {"/see-other", http.StatusSeeOther}} {
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
	}

	key := routertest.Key()
	if got := sendOnce(t, srv, "/bad-gateway", key); got.Status != http.StatusBadGateway {
		t.Errorf("c.NoContent(502): the client got %d", got.Status)
	}
	if rec := kit.Record(t, key); rec.Status != idempotency.StatusFailed {
		t.Errorf("c.NoContent(502) recorded %s with status %d, want failed", rec.Status, rec.Response.Status)
	} else if again := sendOnce(t, srv, "/bad-gateway", key); again.Status != http.StatusConflict || !bytes.Contains(again.Body, []byte("idempotency_previous_failed")) {
		t.Errorf("retry after c.NoContent(502): %d %q, want 409 idempotency_previous_failed", again.Status, again.Body)
	}

	key = routertest.Key()
	before := calls.Load()
	for i := range 2 {
		if got := sendOnce(t, srv, "/too-many", key); got.Status != http.StatusTooManyRequests || got.Header.Get(idempotency.HeaderReplayed) != "" {
			t.Errorf("c.NoContent(429), attempt %d: %d (replayed %q), want a fresh 429", i+1, got.Status, got.Header.Get(idempotency.HeaderReplayed))
		}
	}
	if n := calls.Load() - before; n != 2 {
		t.Errorf("c.NoContent(429) twice with one key: the handler ran %d times, want 2 (the key is released)", n)
	}
}
