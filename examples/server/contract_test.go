package main

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// The HTTP contract of DESIGN.md as the example shows it, walked end to end
// against the in-memory server and, when a database is available, against
// PostgreSQL.

func TestContractMemory(t *testing.T) {
	t.Parallel()
	testContract(t, memoryBackend)
}

func TestContractPostgres(t *testing.T) {
	t.Parallel()
	testContract(t, postgresBackend)
}

// TestContractMySQL walks the same contract on MariaDB (sqlstore's MySQL
// dialect, orders transactional through *sqlstore.Tx).
func TestContractMySQL(t *testing.T) {
	t.Parallel()
	testContract(t, mysqlBackend)
}

var hexHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

func aapl(qty int) map[string]any { return map[string]any{"symbol": "AAPL", "side": "buy", "qty": qty} }

func testContract(t *testing.T, newEnv backend) {
	// One server for the subtests that need no special configuration; each
	// uses users of its own, so they run in parallel.
	shared := newEnv(t, envOptions{})
	if want := shared.srv.mode != "memory"; shared.srv.ordersTransactional != want {
		t.Fatalf("orders transactional = %v, want %v", shared.srv.ordersTransactional, want)
	}

	t.Run("new key executes once, duplicates replay", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		first := e.order(t, tok, key, aapl(10))
		expect(t, first, http.StatusCreated, "")
		id, ok := first.Body["id"].(float64)
		if !ok || id != float64(int64(id)) || id <= 0 {
			t.Fatalf("id is not a positive integer: %s", first)
		}
		wantLocation := fmt.Sprintf("/api/trading/orders/%d", int64(id))
		if got := first.Header.Get("Location"); got != wantLocation {
			t.Fatalf("Location = %q, want %q", got, wantLocation)
		}
		if first.Body["symbol"] != "AAPL" || first.Body["side"] != "buy" || first.Body["qty"] != 10.0 ||
			first.Body["status"] != "filled" || first.Body["client_order_id"] != key {
			t.Fatalf("order body: %s", first)
		}
		if p, ok := first.Body["fill_price"].(float64); !ok || p <= 0 {
			t.Fatalf("fill_price is not a positive number: %s", first)
		}
		if first.Header.Get("Idempotent-Replayed") != "" || first.Body["idempotency_replayed"] != nil {
			t.Fatalf("the original answer is marked replayed: %v %s", first.Header, first)
		}

		// The same key, also in upper case and in the structured-field
		// quoted form, is the same key.
		for i, k := range []string{key, strings.ToUpper(key), `"` + key + `"`} {
			r := e.order(t, tok, k, aapl(10))
			expect(t, r, http.StatusCreated, "")
			if r.Header.Get("Idempotent-Replayed") != "true" || r.Body["idempotency_replayed"] != true {
				t.Fatalf("replay %d not marked: %v %s", i, r.Header, r)
			}
			if r.Body["id"] != id || r.Header.Get("Location") != wantLocation || r.Body["fill_price"] != first.Body["fill_price"] {
				t.Fatalf("replay %d differs from the original %s: %s", i, first, r)
			}
		}
		if n := len(e.orders(t, tok)); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if got := e.auditCounts(t, uid); got["order_placed"] != 1 || got["idempotency_replay"] != 3 || len(got) != 2 {
			t.Fatalf("audit rows %v, want 1 order_placed and 3 idempotency_replay", got)
		}
		placed := e.auditRows(t, uid, "order_placed")[0]
		if placed["order_id"] != id || placed["symbol"] != "AAPL" || placed["side"] != "buy" || placed["qty"] != 10.0 {
			t.Fatalf("order_placed context %v", placed)
		}
		for _, c := range e.auditRows(t, uid, "idempotency_replay") {
			if c["endpoint"] != ordersEndpoint || c["original_status"] != 201.0 || !hexHash.MatchString(fmt.Sprint(c["request_hash"])) {
				t.Fatalf("idempotency_replay context %v", c)
			}
		}
	})

	t.Run("same key, different body is 422", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		expect(t, e.order(t, tok, key, aapl(10)), http.StatusCreated, "")
		expect(t, e.order(t, tok, key, aapl(11)), http.StatusUnprocessableEntity, "idempotency_key_body_mismatch")
		// Member order and white space are not a different body.
		r := e.order(t, tok, key, ` { "qty": 10, "side": "buy", "symbol": "AAPL" } `)
		expect(t, r, http.StatusCreated, "")
		if r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("reordered body not replayed: %s", r)
		}
		if n := len(e.orders(t, tok)); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
		if got := e.auditCounts(t, uid); got["order_placed"] != 1 || got["idempotency_replay"] != 1 {
			t.Fatalf("audit rows %v", got)
		}
	})

	t.Run("malformed key is 400", func(t *testing.T) {
		t.Parallel()
		e := shared
		_, tok := e.newUser(t)
		good := uuid.NewString()
		for _, k := range []string{"not-a-uuid", "{" + good + "}", "urn:uuid:" + good,
			strings.ReplaceAll(good, "-", ""), `"` + good, good + ";a=b"} {
			expect(t, e.order(t, tok, k, aapl(1)), http.StatusBadRequest, "Idempotency-Key must be a UUID string")
		}
		// An empty header, and the header twice.
		for _, h := range []http.Header{{"Idempotency-Key": {""}}, {"Idempotency-Key": {good, good}}} {
			r := e.do(t, req{method: "POST", path: "/api/trading/orders", token: tok, body: aapl(1), header: h})
			expect(t, r, http.StatusBadRequest, "Idempotency-Key must be a UUID string")
		}
		if n := len(e.orders(t, tok)); n != 0 {
			t.Fatalf("%d orders, want none", n)
		}
	})

	t.Run("no key passes through and executes every time", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		a := e.order(t, tok, "", aapl(5))
		b := e.order(t, tok, "", aapl(5))
		expect(t, a, http.StatusCreated, "")
		expect(t, b, http.StatusCreated, "")
		if a.Body["id"] == b.Body["id"] || b.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("want two orders: %s and %s", a, b)
		}
		if _, ok := a.Body["client_order_id"]; ok {
			t.Fatalf("client_order_id without a key: %s", a)
		}
		if got := e.auditCounts(t, uid); got["order_placed"] != 2 || got["idempotency_replay"] != 0 {
			t.Fatalf("audit rows %v", got)
		}
	})

	t.Run("invalid order is 400 and replays as 400", func(t *testing.T) {
		t.Parallel()
		e := shared
		_, tok := e.newUser(t)
		for _, body := range []any{
			map[string]any{"symbol": "aapl", "side": "buy", "qty": 1},
			map[string]any{"symbol": "AAPL", "side": "hold", "qty": 1},
			map[string]any{"symbol": "AAPL", "side": "buy", "qty": 0},
			map[string]any{"symbol": "AAPL", "side": "buy", "qty": 1.5},
			map[string]any{"symbol": "AAPL", "side": "buy", "qty": "1"},
			map[string]any{"symbol": "AAPL", "side": "buy"},
			map[string]any{"symbol": "AAPL", "side": "buy", "qty": 1, "price": 3},
			`{"symbol":"AAPL"`, `[]`, ``, `{"symbol":"AAPL","side":"buy","qty":1} {}`,
		} {
			r := e.order(t, tok, "", body)
			expect(t, r, http.StatusBadRequest, "invalid_order")
			if msg, _ := r.Body["message"].(string); msg == "" {
				t.Fatalf("no message: %s", r)
			}
		}
		// A 400 is a deterministic answer: it is recorded and replayed.
		key := uuid.NewString()
		expect(t, e.order(t, tok, key, map[string]any{"symbol": "AAPL", "side": "buy", "qty": -1}), http.StatusBadRequest, "invalid_order")
		r := e.order(t, tok, key, map[string]any{"symbol": "AAPL", "side": "buy", "qty": -1})
		expect(t, r, http.StatusBadRequest, "invalid_order")
		if r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("400 not replayed: %s", r)
		}
		if n := len(e.orders(t, tok)); n != 0 {
			t.Fatalf("%d orders, want none", n)
		}
	})

	t.Run("fill engine error is 500, then 409 previous_failed", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		xfail := map[string]any{"symbol": "XFAIL", "side": "buy", "qty": 1}
		expect(t, e.order(t, tok, key, xfail), http.StatusInternalServerError, "fill_engine_error")
		expect(t, e.order(t, tok, key, xfail), http.StatusConflict, "idempotency_previous_failed")
		expect(t, e.order(t, tok, "", xfail), http.StatusInternalServerError, "fill_engine_error")
		if n := len(e.orders(t, tok)); n != 0 {
			t.Fatalf("%d orders, want none", n)
		}
		if got := e.auditCounts(t, uid); len(got) != 0 {
			t.Fatalf("audit rows %v, want none", got)
		}
	})

	t.Run("oversized body is 413", func(t *testing.T) {
		t.Parallel()
		e := shared
		_, tok := e.newUser(t)
		big := fmt.Sprintf(`{"symbol":"AAPL","side":"buy","qty":1,"pad":"%s"}`, strings.Repeat("x", 1<<20))
		expect(t, e.order(t, tok, uuid.NewString(), big), http.StatusRequestEntityTooLarge, "idempotency_body_too_large")
		expect(t, e.order(t, tok, "", big), http.StatusRequestEntityTooLarge, "body_too_large")
		if n := len(e.orders(t, tok)); n != 0 {
			t.Fatalf("%d orders, want none", n)
		}
	})

	t.Run("unauthorized is 401", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		_, sig, _ := strings.Cut(tok, ".")
		other := sessions{secret: []byte("another secret")}.token(uid)
		for _, auth := range []string{"", "Bearer", "Bearer nonsense", "Basic " + tok, "Bearer " + tok + "x",
			fmt.Sprintf("Bearer %d.%s", uid+1, sig), "Bearer " + other} {
			for _, rt := range []struct{ method, path string }{
				{"POST", "/api/trading/orders"}, {"GET", "/api/trading/orders"}, {"GET", "/api/trading/orders/1"},
				{"DELETE", "/api/trading/orders/1"}, {"POST", "/api/billing/checkout-sessions"}, {"GET", "/api/billing/checkout-sessions"},
			} {
				r := e.do(t, req{method: rt.method, path: rt.path, key: uuid.NewString(), body: aapl(1),
					header: http.Header{"Authorization": {auth}}})
				expect(t, r, http.StatusUnauthorized, "unauthorized")
			}
		}
		// "bearer" in any case is fine.
		r := e.do(t, req{method: "GET", path: "/api/trading/orders", header: http.Header{"Authorization": {"bEaReR " + tok}}})
		expect(t, r, http.StatusOK, "")
	})

	t.Run("keys are scoped by user", func(t *testing.T) {
		t.Parallel()
		e := shared
		uidA, tokA := e.newUser(t)
		uidB, tokB := e.newUser(t)
		key := uuid.NewString()
		a := e.order(t, tokA, key, aapl(3))
		b := e.order(t, tokB, key, aapl(3))
		expect(t, a, http.StatusCreated, "")
		expect(t, b, http.StatusCreated, "")
		if a.Body["id"] == b.Body["id"] || b.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("user B got user A's order: %s / %s", a, b)
		}
		ra := e.order(t, tokA, key, aapl(3))
		rb := e.order(t, tokB, key, aapl(3))
		if ra.Body["id"] != a.Body["id"] || rb.Body["id"] != b.Body["id"] {
			t.Fatalf("replays crossed users: %s / %s", ra, rb)
		}
		for _, u := range []int64{uidA, uidB} {
			if got := e.auditCounts(t, u); got["order_placed"] != 1 || got["idempotency_replay"] != 1 {
				t.Fatalf("user %d audit rows %v", u, got)
			}
		}
		// The key is scoped by endpoint too: billing with the same key is
		// a different record.
		r := e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tokA, key: key, body: map[string]string{"plan": "pro"}})
		expect(t, r, http.StatusCreated, "")
		if r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("billing replayed an order: %s", r)
		}
	})

	t.Run("order reads and cancel", func(t *testing.T) {
		t.Parallel()
		e := shared
		_, tokA := e.newUser(t)
		_, tokB := e.newUser(t)
		first := e.order(t, tokA, uuid.NewString(), aapl(1))
		second := e.order(t, tokA, "", map[string]any{"symbol": "MSFT", "side": "sell", "qty": 2})
		expect(t, first, http.StatusCreated, "")
		expect(t, second, http.StatusCreated, "")
		list := e.orders(t, tokA)
		if len(list) != 2 || list[0].(map[string]any)["id"] != first.Body["id"] || list[1].(map[string]any)["id"] != second.Body["id"] {
			t.Fatalf("orders %v, want the two orders oldest first", list)
		}
		if n := len(e.orders(t, tokB)); n != 0 {
			t.Fatalf("user B sees %d orders", n)
		}
		loc := first.Header.Get("Location")
		got := e.do(t, req{method: "GET", path: loc, token: tokA})
		expect(t, got, http.StatusOK, "")
		if got.Body["id"] != first.Body["id"] || got.Body["symbol"] != "AAPL" || got.Body["fill_price"] != first.Body["fill_price"] {
			t.Fatalf("GET %s = %s, want %s", loc, got, first)
		}
		for _, p := range []string{loc + "x", "/api/trading/orders/abc", "/api/trading/orders/-1", "/api/trading/orders/99999999"} {
			expect(t, e.do(t, req{method: "GET", path: p, token: tokA}), http.StatusNotFound, "not_found")
		}
		expect(t, e.do(t, req{method: "GET", path: loc, token: tokB}), http.StatusNotFound, "not_found")
		for range 2 {
			r := e.do(t, req{method: "DELETE", path: loc, token: tokA})
			expect(t, r, http.StatusConflict, "order_not_cancellable")
			if r.Body["status"] != "filled" {
				t.Fatalf("cancel: %s", r)
			}
		}
		expect(t, e.do(t, req{method: "DELETE", path: loc, token: tokB}), http.StatusNotFound, "not_found")
		expect(t, e.do(t, req{method: "DELETE", path: "/api/trading/orders/abc", token: tokA}), http.StatusNotFound, "not_found")
	})

	t.Run("billing", func(t *testing.T) {
		t.Parallel()
		e := shared
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		post := func(key string, body any) response {
			return e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: key, body: body})
		}
		first := post(key, map[string]string{"plan": "pro"})
		expect(t, first, http.StatusCreated, "")
		if id, _ := first.Body["id"].(string); !strings.HasPrefix(id, "cs_") || first.Body["plan"] != "pro" {
			t.Fatalf("checkout session: %s", first)
		}
		replay := post(key, map[string]string{"plan": "pro"})
		expect(t, replay, http.StatusCreated, "")
		if replay.Body["id"] != first.Body["id"] || replay.Header.Get("Idempotent-Replayed") != "true" || replay.Body["idempotency_replayed"] != true {
			t.Fatalf("replay: %s", replay)
		}
		expect(t, post(key, map[string]string{"plan": "team"}), http.StatusUnprocessableEntity, "idempotency_key_body_mismatch")
		expect(t, post("", map[string]string{"plan": "gold"}), http.StatusBadRequest, "invalid_checkout_session")
		expect(t, post("", `{"plan":`), http.StatusBadRequest, "invalid_checkout_session")
		expect(t, post("", map[string]string{"plan": "basic"}), http.StatusCreated, "")
		list := e.do(t, req{method: "GET", path: "/api/billing/checkout-sessions", token: tok})
		expect(t, list, http.StatusOK, "")
		if s, _ := list.Body["checkout_sessions"].([]any); len(s) != 2 {
			t.Fatalf("checkout sessions: %s", list)
		}
		rows := e.auditRows(t, uid, "idempotency_replay")
		if len(rows) != 1 || rows[0]["endpoint"] != "POST /api/billing/checkout-sessions" || rows[0]["original_status"] != 201.0 {
			t.Fatalf("replay audit rows %v", rows)
		}
	})

	t.Run("demo users", func(t *testing.T) {
		t.Parallel()
		e := shared
		for _, body := range []any{nil, "", map[string]string{"name": "ann"}} {
			r := e.do(t, req{method: "POST", path: "/api/demo/users", body: body})
			expect(t, r, http.StatusCreated, "")
			if r.Body["user_id"] == nil || r.Body["token"] == "" {
				t.Fatalf("create user: %s", r)
			}
		}
		for _, body := range []any{"nope", map[string]any{"name": 3}, map[string]string{"name": strings.Repeat("é", 101)}} {
			expect(t, e.do(t, req{method: "POST", path: "/api/demo/users", body: body}), http.StatusBadRequest, "invalid_user")
		}
	})

	t.Run("unknown routes and methods answer JSON", func(t *testing.T) {
		t.Parallel()
		e := shared
		_, tok := e.newUser(t)
		expect(t, e.do(t, req{method: "GET", path: "/nope"}), http.StatusNotFound, "not_found")
		expect(t, e.do(t, req{method: "GET", path: "/api/trading/orders/1/fills", token: tok}), http.StatusNotFound, "not_found")
		r := e.do(t, req{method: "PUT", path: "/api/trading/orders", token: tok})
		expect(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		if r.Header.Get("Allow") == "" {
			t.Fatalf("405 without Allow: %v", r.Header)
		}
	})

	t.Run("healthz and metrics", func(t *testing.T) {
		t.Parallel()
		e := shared
		r := e.do(t, req{method: "GET", path: "/healthz"})
		expect(t, r, http.StatusOK, "")
		if r.Body["status"] != "ok" {
			t.Fatalf("healthz: %s", r)
		}
		_, tok := e.newUser(t)
		key := uuid.NewString()
		e.order(t, tok, key, aapl(1))
		e.order(t, tok, key, aapl(1))
		m := e.do(t, req{method: "GET", path: "/metrics"})
		expect(t, m, http.StatusOK, "")
		for _, want := range []string{
			`idempotency_miss_total{endpoint="POST /api/trading/orders"}`,
			`idempotency_replay_total{endpoint="POST /api/trading/orders"}`,
			`idempotency_store_duration_seconds_count{operation="claim"}`,
			`go_goroutines`,
		} {
			if !strings.Contains(string(m.Raw), want) {
				t.Fatalf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("concurrent duplicate is 409 in flight", func(t *testing.T) {
		t.Parallel()
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		e := newEnv(t, envOptions{beforeFill: func(ctx context.Context, o order) {
			if o.Symbol != "SLOW" {
				return
			}
			once.Do(func() { close(started) })
			select {
			case <-release:
			case <-ctx.Done():
			}
		}})
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		slow := map[string]any{"symbol": "SLOW", "side": "buy", "qty": 1}
		type result struct {
			r   response
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := e.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: slow})
			done <- result{r, err}
		}()
		select {
		case <-started:
		case <-time.After(waitLimit):
			t.Fatal("the first order never reached the fill engine")
		}
		dup := e.order(t, tok, key, slow)
		expect(t, dup, http.StatusConflict, "idempotency_in_flight")
		if dup.Header.Get("Retry-After") != "5" || dup.Body["retry_after_ms"] != 5000.0 {
			t.Fatalf("in flight: %v %s", dup.Header, dup)
		}
		close(release)
		var first result
		select {
		case first = <-done:
		case <-time.After(waitLimit):
			t.Fatal("the first order never finished")
		}
		if first.err != nil {
			t.Fatal(first.err)
		}
		expect(t, first.r, http.StatusCreated, "")
		replay := e.order(t, tok, key, slow)
		expect(t, replay, http.StatusCreated, "")
		if replay.Body["id"] != first.r.Body["id"] {
			t.Fatalf("replay %s, original %s", replay, first.r)
		}
		if got := e.auditCounts(t, uid); got["order_placed"] != 1 || got["idempotency_replay"] != 1 {
			t.Fatalf("audit rows %v", got)
		}
	})

	t.Run("order past its deadline is 504 fill_timeout", func(t *testing.T) {
		t.Parallel()
		// A keyed order's context ends at lease - store timeout: 2s here.
		e := newEnv(t, envOptions{lease: 3 * time.Second, storeTimeout: time.Second, orderLatency: time.Hour})
		_, tok := e.newUser(t)
		key := uuid.NewString()
		start := time.Now()
		expect(t, e.order(t, tok, key, aapl(1)), http.StatusGatewayTimeout, "fill_timeout")
		if d := time.Since(start); d > 5*3*time.Second {
			t.Fatalf("504 took %v", d)
		}
		expect(t, e.order(t, tok, key, aapl(1)), http.StatusConflict, "idempotency_previous_failed")
		if n := len(e.orders(t, tok)); n != 0 {
			t.Fatalf("%d orders, want none", n)
		}
	})

	t.Run("order latency delays the fill", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{orderLatency: 50 * time.Millisecond})
		_, tok := e.newUser(t)
		start := time.Now()
		expect(t, e.order(t, tok, uuid.NewString(), aapl(1)), http.StatusCreated, "")
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Fatalf("order filled in %v, before the latency", d)
		}
	})

	t.Run("new-orders gate runs before the middleware", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{})
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		expect(t, e.order(t, tok, key, aapl(1)), http.StatusCreated, "")
		claims := func() float64 {
			return metric(t, e.srv.reg, "idempotency_store_duration_seconds", map[string]string{"operation": "claim"})
		}
		before := claims()

		e.vars.set(envNewOrdersDisable, "1")
		for _, k := range []string{key, uuid.NewString(), "", "not-a-uuid"} {
			expect(t, e.order(t, tok, k, aapl(1)), http.StatusServiceUnavailable, "new_orders_disabled")
		}
		if got := claims(); got != before {
			t.Fatalf("the store was asked %v times while the gate was closed", got-before)
		}
		if got := e.auditCounts(t, uid); got["idempotency_replay"] != 0 {
			t.Fatalf("a gated replay was audited: %v", got)
		}
		// Reads and billing are not gated.
		e.orders(t, tok)
		expect(t, e.do(t, req{method: "POST", path: "/api/billing/checkout-sessions", token: tok, body: map[string]string{"plan": "pro"}}), http.StatusCreated, "")

		e.vars.set(envNewOrdersDisable, "0")
		r := e.order(t, tok, key, aapl(1))
		expect(t, r, http.StatusCreated, "")
		if r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("not a replay once the gate opened: %s", r)
		}
		if n := len(e.orders(t, tok)); n != 1 {
			t.Fatalf("%d orders, want 1", n)
		}
	})

	t.Run("kill-switch off executes duplicates", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{vars: map[string]string{"FLAG_IDEMPOTENCY_MIDDLEWARE": " Off "}})
		uid, tok := e.newUser(t)
		key := uuid.NewString()
		a := e.order(t, tok, key, aapl(1))
		b := e.order(t, tok, key, aapl(1))
		c := e.order(t, tok, "not-a-uuid", aapl(1)) // no validation either
		for _, r := range []response{a, b, c} {
			expect(t, r, http.StatusCreated, "")
			if r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("replayed with the middleware off: %s", r)
			}
		}
		if a.Body["id"] == b.Body["id"] {
			t.Fatalf("duplicate not executed: %s / %s", a, b)
		}
		if got := e.auditCounts(t, uid); got["order_placed"] != 3 {
			t.Fatalf("audit rows %v", got)
		}
		if got := metric(t, e.srv.reg, "idempotency_bypasses_total", map[string]string{"endpoint": ordersEndpoint, "reason": "disabled"}); got != 3 {
			t.Fatalf("disabled bypasses = %v, want 3", got)
		}
		// Switched back on (per request), keys work again.
		e.vars.set("FLAG_IDEMPOTENCY_MIDDLEWARE", "")
		expect(t, e.order(t, tok, "not-a-uuid", aapl(1)), http.StatusBadRequest, "Idempotency-Key must be a UUID string")
	})
}
