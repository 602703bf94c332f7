package idemecho_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/echo"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/labstack/echo/v4"
)

// TestEchoTransactional: on a transactional route a handler that writes and
// then returns an error, or answers c.NoContent(502), must roll its writes
// back. With the adapter echo's 500 is rendered inside the middleware, so
// it does; with plain echo.WrapMiddleware the writes commit under a
// recorded 200.
func TestEchoTransactional(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (account text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		RouteName: idemecho.RouteName,
		Enabled:   func(context.Context) bool { return true },
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	tx := mw.MustRoute(idempotency.RouteConfig{Transactional: true})
	insertThen := func(answer func(echo.Context) error) echo.HandlerFunc {
		return func(c echo.Context) error {
			tx, _ := idempotency.TxFromContext(c.Request().Context())
			if _, err := tx.Exec(c.Request().Context(), `INSERT INTO orders VALUES ($1)`, c.Param("id")); err != nil {
				return err
			}
			return answer(c)
		}
	}
	fails := insertThen(func(echo.Context) error { return errors.New("broker down") })
	e := newEcho()
	e.POST("/adapted/:id", fails, idemecho.Middleware(tx))
	e.POST("/plain/:id", fails, echo.WrapMiddleware(tx))
	e.POST("/status-only/:id", insertThen(func(c echo.Context) error { return c.NoContent(http.StatusBadGateway) }), idemecho.Middleware(tx))
	e.POST("/ok/:id", insertThen(func(c echo.Context) error { return c.JSON(http.StatusCreated, map[string]int{"id": 1}) }), idemecho.Middleware(tx))
	srv := start(t, e)

	count := func(account string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE account = $1`, account).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := routertest.Send(t, srv, "POST", "/adapted/a1", routertest.Key(), `{}`); got.Status != http.StatusInternalServerError {
		t.Errorf("adapted: %d %q, want 500", got.Status, got.Body)
	}
	if n := count("a1"); n != 0 {
		t.Errorf("adapted: the failed handler's write committed (%d rows)", n)
	}
	if got := routertest.Send(t, srv, "POST", "/status-only/a4", routertest.Key(), `{}`); got.Status != http.StatusBadGateway || count("a4") != 0 {
		t.Errorf("c.NoContent(502): %d with %d rows, want 502 and the write rolled back", got.Status, count("a4"))
	}
	key := routertest.Key()
	first := routertest.Send(t, srv, "POST", "/ok/a2", key, `{}`)
	replay := routertest.Send(t, srv, "POST", "/ok/a2", key, `{}`)
	if first.Status != http.StatusCreated || replay.Status != http.StatusCreated || replay.Header.Get(idempotency.HeaderReplayed) != "true" || count("a2") != 1 {
		t.Errorf("ok: %d then %d (replayed %q), %d rows", first.Status, replay.Status, replay.Header.Get(idempotency.HeaderReplayed), count("a2"))
	}
	// Why the adapter exists.
	if got := routertest.Send(t, srv, "POST", "/plain/a3", routertest.Key(), `{}`); got.Status != http.StatusOK || count("a3") != 1 {
		t.Errorf("plain WrapMiddleware: %d with %d rows; the adapter may no longer be needed", got.Status, count("a3"))
	}
}
