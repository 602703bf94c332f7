package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
	"github.com/idemkit/idempotency/examples/server/live"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The order servers' settings in the venue tests: a keyed order's handler
// has the lease minus the store timeout, 2.5 s, for its venue call.
const (
	testLease         = 3 * time.Second
	testStoreTimeout  = 500 * time.Millisecond
	testDeriveKeys    = "v1:BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU="
	testSessionSecret = "venue-test-session-secret"
)

// The environment of the ordinary-route server, which is this test binary
// run again (settled item 18: "a test server built in examples/venue's
// tests from the same order handler with Transactional: false").
const (
	envOrdinaryDSN     = "VENUE_TEST_ORDINARY_DSN"
	envOrdinaryVenue   = "VENUE_TEST_ORDINARY_VENUE"
	envOrdinaryLatency = "VENUE_TEST_ORDINARY_LATENCY"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(envOrdinaryDSN); dsn != "" {
		os.Exit(serveOrdinary(dsn))
	}
	goleak.VerifyTestMain(testdb.Main(m))
}

// startOrdinary starts the ordinary-route server on dsn, sending its
// orders to venueURL after latency.
func startOrdinary(t *testing.T, dsn, venueURL string, latency time.Duration) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envOrdinaryDSN+"="+dsn, envOrdinaryVenue+"="+venueURL, envOrdinaryLatency+"="+latency.String())
	return startProc(t, "ordinary server", cmd)
}

// userKey carries the ordinary server's user, from the X-User-ID header.
type userKey struct{}

// serveOrdinary is the ordinary-route server: POST /api/trading/orders
// through live.Handler behind an ordinary (not transactional), fail-closed
// route on the pgx store, scoped by the X-User-ID header. It answers a
// fill with 201 {"status":"filled", "symbol", "side", "qty", "fill_price",
// "client_order_id"} and serves until killed.
func serveOrdinary(dsn string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	fail := func(err error) int { log.Error("ordinary server failed", "error", err); return 1 }
	latency, err := time.ParseDuration(os.Getenv(envOrdinaryLatency))
	if err != nil {
		return fail(err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	keys, err := downstream.ParseKeys(testDeriveKeys)
	if err != nil {
		return fail(err)
	}
	scope := func(ctx context.Context) string { u, _ := ctx.Value(userKey{}).(string); return u }
	idem, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		Lease: testLease, StoreTimeout: testStoreTimeout, Scope: scope, Logger: log, DeriveKeys: keys,
	})
	if err != nil {
		return fail(err)
	}
	venue := &live.Client{URL: os.Getenv(envOrdinaryVenue)}
	route, err := idem.Route(idempotency.RouteConfig{TTL: 24 * time.Hour, Reconcile: live.Reconcile(venue, reconciledFill)})
	if err != nil {
		return fail(err)
	}
	h := &live.Handler{
		Venue:   venue,
		Derive:  live.DeriveOrderID,
		Read:    readOrdinaryOrder,
		Filled:  writeOrdinaryFill,
		Latency: latency,
		Log:     log,
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api/trading/orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), userKey{}, r.Header.Get("X-User-ID"))
		route(h).ServeHTTP(w, r.WithContext(ctx))
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	log.Info("listening", "addr", ln.Addr().String())
	return fail(http.Serve(ln, mux))
}

// readOrdinaryOrder reads {"symbol", "side", "qty"}.
func readOrdinaryOrder(w http.ResponseWriter, r *http.Request) (live.Request, bool) {
	var in live.Request
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Symbol == "" || in.Qty < 1 {
		w.WriteHeader(http.StatusBadRequest)
		return in, false
	}
	return in, true
}

// writeOrdinaryFill answers the venue's fill as the example server does,
// without a local order book.
func writeOrdinaryFill(w http.ResponseWriter, r *http.Request, _ live.Request, o live.Order) {
	body, err := ordinaryFillBody(o)
	if err != nil {
		idempotency.Unsettled(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// reconciledFill is the reconcile hook's answer for an order the venue
// holds: the handler's.
func reconciledFill(_ context.Context, _ idempotency.ReconcileInfo, o live.Order) (idempotency.Response, error) {
	body, err := ordinaryFillBody(o)
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
}

// ordinaryFillBody is the 201's body: {"status":"filled", "symbol",
// "side", "qty", "fill_price", "client_order_id"}, from the venue's order.
func ordinaryFillBody(o live.Order) ([]byte, error) {
	price, err := o.FillPrice()
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"status": "filled", "symbol": o.Symbol, "side": o.Side,
		"qty": o.Qty, "fill_price": price, "client_order_id": o.ClientOrderID})
}
