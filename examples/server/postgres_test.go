package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestOrderStormPostgres fires 20 concurrent copies of each of 10 keys at
// two replicas (two servers, two pools, one database): exactly one order per
// key may exist afterwards.
func TestOrderStormPostgres(t *testing.T) {
	t.Parallel()
	// Generous store timeout: 200 requests under the race detector may
	// wait for pooled connections, and a 503 would prove nothing here.
	// 10 connections per replica keeps the test's share of the server's
	// connections small while other packages' tests run.
	opts := envOptions{lease: time.Minute, storeTimeout: 15 * time.Second, poolOptions: []testdb.Option{testdb.MaxConns(10)}}
	a := postgresBackend(t, opts)
	b := startEnv(t, opts, secondPool(t, a.pool))
	replicas := []*testEnv{a, b}
	uid, tok := a.newUser(t) // stateless tokens work on both replicas

	const keys, copies = 10, 20
	type result struct {
		r   response
		err error
	}
	results := make([][]result, keys)
	keyOf := make([]string, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		keyOf[k] = uuid.NewString()
		results[k] = make([]result, copies)
		for c := range copies {
			wg.Go(func() {
				<-start
				r, err := replicas[c%2].try(req{method: "POST", path: "/api/trading/orders", token: tok, key: keyOf[k],
					body: map[string]any{"symbol": "AAPL", "side": "buy", "qty": k + 1}})
				results[k][c] = result{r, err}
			})
		}
	}
	close(start)
	wg.Wait()

	replays := 0
	for k := range keys {
		var originals int
		var id any
		for _, res := range results[k] {
			if res.err != nil {
				t.Fatal(res.err)
			}
			r := res.r
			switch {
			case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
				originals++
			case r.Status == http.StatusCreated:
				replays++
			case r.Status == http.StatusConflict && r.Body["error"] == "idempotency_in_flight":
				continue
			default:
				t.Fatalf("key %d: unexpected answer %s", k, r)
			}
			if id == nil {
				id = r.Body["id"]
			} else if r.Body["id"] != id {
				t.Fatalf("key %d: answers name orders %v and %v", k, id, r.Body["id"])
			}
		}
		if originals != 1 {
			t.Fatalf("key %d executed %d times, want 1", k, originals)
		}
	}

	ctx := context.Background()
	rows, err := a.pool.Query(ctx, `SELECT client_order_id, count(*) FROM paper_orders WHERE user_id = $1 GROUP BY 1`, uid)
	if err != nil {
		t.Fatal(err)
	}
	perKey := map[string]int64{}
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		perKey[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for k, key := range keyOf {
		if perKey[key] != 1 {
			t.Fatalf("key %d has %d rows in paper_orders, want 1 (all: %v)", k, perKey[key], perKey)
		}
	}
	if len(perKey) != keys {
		t.Fatalf("paper_orders has orders for %d keys, want %d: %v", len(perKey), keys, perKey)
	}
	if got := a.auditCounts(t, uid); got["order_placed"] != keys || got["idempotency_replay"] != replays {
		t.Fatalf("audit rows %v, want %d order_placed and %d idempotency_replay", got, keys, replays)
	}
}

// secondPool opens another pool on the schema of pool, as a second replica
// would.
func secondPool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), pool.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// directConn connects to the schema of pool without going through pool's
// host and port (a proxy in outage tests).
func directConn(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	delete(cfg.RuntimeParams, "options")
	cfg.RuntimeParams["search_path"] = pool.Config().ConnConfig.RuntimeParams["search_path"]
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// proxyTo starts a TCP proxy in front of the test database server.
func proxyTo(t *testing.T) (*tcpproxy.Proxy, string, uint16) {
	t.Helper()
	cfg, err := pgx.ParseConfig(testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, portText, _ := net.SplitHostPort(proxy.Addr())
	port, _ := strconv.ParseUint(portText, 10, 16)
	return proxy, host, uint16(port)
}

// TestDatabaseCutPostgres cuts the database off a running server: orders
// fail closed (503, nothing executed), billing fails open (201), sessions
// and health checks keep working; after the database returns, the refused
// order's retry executes.
func TestDatabaseCutPostgres(t *testing.T) {
	t.Parallel()
	proxy, host, port := proxyTo(t)
	e := postgresBackend(t, envOptions{lease: 5 * time.Second, storeTimeout: 500 * time.Millisecond,
		poolOptions: []testdb.Option{testdb.Configure(func(c *pgxpool.Config) {
			c.ConnConfig.Host, c.ConnConfig.Port = host, port
			c.ConnConfig.ConnectTimeout = 2 * time.Second
		})}})
	db := directConn(t, e.pool)
	uid, tok := e.newUser(t)
	before := uuid.NewString()
	expect(t, e.order(t, tok, before, aapl(1)), http.StatusCreated, "")

	proxy.Cut()

	expect(t, e.do(t, req{method: "GET", path: "/healthz"}), http.StatusOK, "")
	refused := uuid.NewString()
	for _, key := range []string{refused, before} {
		r := e.order(t, tok, key, aapl(1))
		expect(t, r, http.StatusServiceUnavailable, "idempotency_store_unavailable")
		if r.Header.Get("Retry-After") != "1" {
			t.Fatalf("503 without Retry-After: 1: %v", r.Header)
		}
	}
	// Without a key the order cannot be written either.
	if r := e.order(t, tok, "", aapl(1)); r.Status != http.StatusServiceUnavailable ||
		(r.Body["error"] != "database_unavailable" && r.Body["error"] != "idempotency_store_unavailable") {
		t.Fatalf("unkeyed order during the outage: %s", r)
	}
	// Billing fails open; the fake provider deduplicates on the key.
	billingKey := uuid.NewString()
	var sessionID any
	for range 2 {
		r := e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: billingKey, body: map[string]string{"plan": "pro"}})
		expect(t, r, http.StatusCreated, "")
		if sessionID != nil && r.Body["id"] != sessionID {
			t.Fatalf("the provider created a second session: %s", r)
		}
		sessionID = r.Body["id"]
	}
	list := e.do(t, req{method: "GET", path: "/api/billing/checkout-sessions", token: tok})
	if s, _ := list.Body["checkout_sessions"].([]any); len(s) != 1 {
		t.Fatalf("checkout sessions during the outage: %s", list)
	}
	if got := metric(t, e.srv.reg, "idempotency_rejections_total", map[string]string{"endpoint": ordersEndpoint, "reason": "store_unavailable"}); got < 2 {
		t.Fatalf("store_unavailable rejections = %v, want >= 2", got)
	}
	if got := metric(t, e.srv.reg, "idempotency_bypasses_total", map[string]string{"endpoint": "POST /api/billing/checkout-sessions", "reason": "store_unavailable"}); got != 2 {
		t.Fatalf("store_unavailable bypasses = %v, want 2", got)
	}

	// Nothing was executed during the outage.
	ctx := context.Background()
	var orders, placed int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM paper_orders WHERE user_id = $1`, uid).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE user_id = $1 AND action = 'order_placed'`, uid).Scan(&placed); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || placed != 1 {
		t.Fatalf("after the outage: %d orders, %d order_placed rows; want 1 and 1", orders, placed)
	}

	// A 503 is safe to retry: once the database is back, the same key
	// executes. The pool may hand out a broken connection or two first.
	proxy.Restore()
	deadline := time.Now().Add(waitLimit)
	for {
		r := e.order(t, tok, refused, aapl(1))
		if r.Status == http.StatusCreated {
			if r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("the refused key was recorded: %s", r)
			}
			break
		}
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("retry after the outage: %s", r)
		}
		time.Sleep(50 * time.Millisecond) // polling for the pool to recover, not synchronisation
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM paper_orders WHERE user_id = $1`, uid).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if orders != 2 {
		t.Fatalf("%d orders after the retry, want 2", orders)
	}
}

// TestStartupWaitsForDatabasePostgres starts the server while its database
// is unreachable, then brings the database back within the wait.
func TestStartupWaitsForDatabasePostgres(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	proxy, host, port := proxyTo(t)
	proxy.Cut()
	cfgDSN, err := rewriteHost(dsn, net.JoinHostPort(host, strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-database-url", cfgDSN}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogWatcher()
	cfg.logger = slogJSON(logs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, cfg) }()

	logs.waitFor(t, "database not reachable yet; retrying")
	proxy.Restore()
	listening := logs.waitFor(t, "listening")
	if listening["store"] != "postgres" {
		t.Fatalf("listening line %v", listening)
	}
	c := newClient(t, "http://"+fmt.Sprint(listening["addr"]))
	_, tok := c.newUser(t)
	expect(t, c.order(t, tok, uuid.NewString(), aapl(1)), http.StatusCreated, "")
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("serve did not return after its context ended")
	}
}

func TestPoolConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn  string
		want int32
	}{
		{"postgres://u@db.invalid/app", minPoolConns},
		{"postgres://u@db.invalid/app?pool_max_conns=5", 5},
		{"postgres://u@db.invalid/app?pool_max_conns=50", 50},
		{"host=db.invalid user=u pool_max_conns=7", 7},
		{"host=db.invalid user=u", minPoolConns},
	} {
		pc, err := poolConfig(tc.dsn)
		if err != nil {
			t.Fatalf("%s: %v", tc.dsn, err)
		}
		if pc.MaxConns < tc.want || (tc.want != minPoolConns && pc.MaxConns != tc.want) {
			t.Errorf("%s: MaxConns = %d, want %d", tc.dsn, pc.MaxConns, tc.want)
		}
	}
}
