package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestDatabaseBlackholedPostgres: with the database black-holed (a
// partition: connections accepted, nothing answered), every route answers
// within a bound: the idempotency routes by the store timeout (orders 503),
// the example's own data routes by the same deadline on each repo call (503
// database_unavailable). Found by a review: they used to hang for as long
// as the client waited.
func TestDatabaseBlackholedPostgres(t *testing.T) {
	t.Parallel()
	const storeTimeout = 500 * time.Millisecond
	proxy, host, port := proxyTo(t)
	e := postgresBackend(t, envOptions{lease: 5 * time.Second, storeTimeout: storeTimeout,
		poolOptions: []testdb.Option{testdb.Configure(func(c *pgxpool.Config) {
			// Through the proxy; the test bounds the client, not the pool.
			c.ConnConfig.Host, c.ConnConfig.Port = host, port
		})}})
	_, tok := e.newUser(t)
	expect(t, e.order(t, tok, uuid.NewString(), aapl(1)), http.StatusCreated, "")

	proxy.Blackhole()
	defer proxy.Restore()

	bounded := &client{base: e.base, hc: &http.Client{Transport: e.hc.Transport, Timeout: 10 * storeTimeout}}

	// The library's routes are bounded by the store timeout.
	r, err := bounded.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: uuid.NewString(), body: aapl(1)})
	if err != nil || r.Status != http.StatusServiceUnavailable {
		t.Fatalf("keyed order with the database black-holed: %v %v, want 503 in time", r, err)
	}

	// The example's own data routes: each should answer (503
	// database_unavailable) within the bound, as they do when the
	// database refuses connections.
	for _, rq := range []req{
		{method: "GET", path: "/api/trading/orders", token: tok},
		{method: "GET", path: "/api/trading/orders/1", token: tok},
		{method: "POST", path: "/api/demo/users", body: map[string]string{"name": "x"}},
	} {
		start := time.Now()
		r, err := bounded.try(rq)
		if err != nil {
			t.Errorf("%s %s with the database black-holed: no answer after %v: %v",
				rq.method, rq.path, time.Since(start).Round(time.Millisecond), err)
			continue
		}
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s %s: %s, want 503 database_unavailable", rq.method, rq.path, r)
		}
	}
}

// TestBillingKeyReuseRefusedDuringOutage: the billing route fails open
// because the fake provider deduplicates on the key, as Stripe does; like
// Stripe it also refuses the key reused for another plan, so the answer
// during an outage matches the middleware's 422 while the store is up.
// Found by a review: the fake used to return the first plan's session.
func TestBillingKeyReuseRefusedDuringOutage(t *testing.T) {
	t.Parallel()
	proxy, host, port := proxyTo(t)
	e := postgresBackend(t, envOptions{lease: 5 * time.Second, storeTimeout: 500 * time.Millisecond,
		poolOptions: []testdb.Option{testdb.Configure(func(c *pgxpool.Config) {
			c.ConnConfig.Host, c.ConnConfig.Port = host, port
			c.ConnConfig.ConnectTimeout = 2 * time.Second
		})}})
	_, tok := e.newUser(t)

	// With the store up: same key, other plan -> 422.
	up := uuid.NewString()
	expect(t, e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: up, body: map[string]string{"plan": "pro"}}), http.StatusCreated, "")
	expect(t, e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: up, body: map[string]string{"plan": "team"}}),
		http.StatusUnprocessableEntity, "idempotency_key_body_mismatch")

	proxy.Cut()
	defer proxy.Restore()
	down := uuid.NewString()
	expect(t, e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: down, body: map[string]string{"plan": "pro"}}), http.StatusCreated, "")
	expect(t, e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: down, body: map[string]string{"plan": "team"}}),
		http.StatusUnprocessableEntity, "idempotency_key_body_mismatch")
	r := e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: down, body: map[string]string{"plan": "pro"}})
	expect(t, r, http.StatusCreated, "")
	if r.Body["plan"] != "pro" {
		t.Fatalf("the same key and plan again during the outage: %s, want the pro session", r)
	}
}
