package idemgin_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gin"
	"github.com/idemkit/idempotency/internal/routertest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestGinTransactionalStatusOnly: on a transactional route, a handler that
// writes and then answers c.Status(502) with no body must roll its write
// back, and the client must see the 502; a c.Status(204) commits and
// replays as 204. Before the fix the 502 reached the middleware as 200, so
// the write committed under a recorded success.
func TestGinTransactionalStatusOnly(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (account text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		RouteName: idemgin.RouteName,
		Enabled:   func(context.Context) bool { return true },
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	insertThen := func(status int) gin.HandlerFunc {
		return func(c *gin.Context) {
			tx, _ := idempotency.TxFromContext(c.Request.Context())
			if _, err := tx.Exec(c.Request.Context(), `INSERT INTO orders VALUES ($1)`, c.Param("id")); err != nil {
				c.AbortWithStatus(http.StatusInternalServerError)
				return
			}
			c.Status(status)
		}
	}
	e := gin.New()
	g := e.Group("/accounts/:id", idemgin.Middleware(mw.MustRoute(idempotency.RouteConfig{Transactional: true})))
	g.POST("/bad-gateway", insertThen(http.StatusBadGateway))
	g.POST("/no-content", insertThen(http.StatusNoContent))
	srv := start(t, e)

	count := func(account string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE account = $1`, account).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := sendOnce(t, srv, "/accounts/a1/bad-gateway", routertest.Key()); got.Status != http.StatusBadGateway {
		t.Errorf("c.Status(502): the client got %d", got.Status)
	}
	if n := count("a1"); n != 0 {
		t.Errorf("c.Status(502): the handler's write committed (%d rows)", n)
	}
	key := routertest.Key()
	first, replay := sendOnce(t, srv, "/accounts/a2/no-content", key), sendOnce(t, srv, "/accounts/a2/no-content", key)
	if first.Status != http.StatusNoContent || replay.Status != http.StatusNoContent || replay.Header.Get(idempotency.HeaderReplayed) != "true" || count("a2") != 1 {
		t.Errorf("c.Status(204): %d then %d (replayed %q), %d rows; want 204, a 204 replay, 1 row",
			first.Status, replay.Status, replay.Header.Get(idempotency.HeaderReplayed), count("a2"))
	}
}
