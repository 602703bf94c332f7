package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFailedBeginLogsBegin: a transactional route whose BEGIN cannot reach
// the database (a refused connection) logs the operation the metric counts,
// begin, not claim.
func TestFailedBeginLogsBegin(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://postgres@%s/postgres?connect_timeout=2", addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs syncBuffer
	mw := newHooked(t, NewPostgresStore(pool), Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), StoreTimeout: 5 * time.Second})
	h := mw.MustRoute(RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran")
	}))
	if w := send(t, h, http.MethodPost, "/orders", "1b2f4c1e-7d3a-4e8b-a6c5-0f1e2d3c4b5a", `{}`); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("BEGIN refused: %d %s, want 503", w.Code, w.Body)
	}
	if n := testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues("begin", ReasonConnection)); n != 1 {
		t.Errorf("store_errors_total{operation=begin,reason=connection} = %v, want 1", n)
	}
	if out := logs.String(); !strings.Contains(out, `"operation":"begin"`) || strings.Contains(out, `"operation":"claim"`) {
		t.Errorf("the log does not say operation begin:\n%s", out)
	}
}
