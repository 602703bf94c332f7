package idempotency

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// keyExpiredBody is the 422 of a tombstone in the default format.
const keyExpiredBody = `{"error":"idempotency_key_expired"}`

// TestExpiredRefuse: under ExpiredRefuse a key past its TTL answers 422
// idempotency_key_expired, to the same body and to another alike, and
// runs nothing until its grace ends; cleanup purges its response at expiry
// and keeps the row, deletes it after the grace, and the key is then new.
func TestExpiredRefuse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders", TTL: time.Hour, Expired: ExpiredRefuse, Grace: 2 * time.Hour}, orderHandler)
	ctx := context.Background()

	if w := send(t, rt, "POST", "/orders", testKey, `{"qty":1}`, "X-User", "u1"); w.Code != 201 {
		t.Fatalf("first call: %d %s", w.Code, w.Body)
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{"qty":1}`, "X-User", "u1"); w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("inside the TTL: %d %s, want the replay", w.Code, w.Body)
	}

	h.clock.Advance(time.Hour + time.Second)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{"qty":1}`, "X-User", "u1"), 422, keyExpiredBody)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{"qty":2}`, "X-User", "u1"), 422, keyExpiredBody)
	if got := testutil.ToFloat64(h.mw.metrics.conflicts.WithLabelValues("orders", "key_expired")); got != 2 {
		t.Errorf(`idempotency_conflicts_total{reason="key_expired"} = %v, want 2`, got)
	}

	if _, err := h.mw.Cleanup(ctx, 0); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	recs, err := h.store.ExportScope(ctx, "u1")
	if err != nil || len(recs) != 1 {
		t.Fatalf("after Cleanup at expiry: %d rows (%v), want the tombstone", len(recs), err)
	}
	if r := recs[0].Response; r.Body != nil || r.Header != nil || r.Status != 201 {
		t.Errorf("the tombstone after Cleanup keeps %+v, want no body, no headers, status 201", r)
	}
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{"qty":1}`, "X-User", "u1"), 422, keyExpiredBody)
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("executions during the grace = %d, want 1", n)
	}

	h.clock.Advance(2 * time.Hour)
	if _, err := h.mw.Cleanup(ctx, 0); err != nil {
		t.Fatalf("Cleanup after the grace: %v", err)
	}
	if recs, err := h.store.ExportScope(ctx, "u1"); err != nil || len(recs) != 0 {
		t.Fatalf("after Cleanup past the grace: %d rows (%v), want none", len(recs), err)
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{"qty":2}`, "X-User", "u1"); w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("after the grace: %d %s, want a new execution", w.Code, w.Body)
	}
	if n := h.calls.Load(); n != 2 {
		t.Fatalf("executions = %d, want 2", n)
	}
}

// TestExpiredRefuseGraceOverBeforeCleanup: a key past its grace that
// cleanup has not deleted yet is taken over as new.
func TestExpiredRefuseGraceOverBeforeCleanup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders", TTL: time.Hour, Expired: ExpiredRefuse}, orderHandler)
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 {
		t.Fatalf("first call: %d", w.Code)
	}
	h.clock.Advance(90 * time.Minute) // Grace defaults to the TTL
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{}`), 422, keyExpiredBody)
	h.clock.Advance(31 * time.Minute)
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 || h.calls.Load() != 2 {
		t.Fatalf("past TTL + Grace: %d, %d executions; want 201 and 2", w.Code, h.calls.Load())
	}
}

// TestExpiredRunAgainUnchanged: the default runs an expired key again, and
// leaves no tombstone for cleanup to keep.
func TestExpiredRunAgainUnchanged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders", TTL: time.Hour}, orderHandler)
	if w := send(t, rt, "POST", "/orders", testKey, `{}`, "X-User", "u1"); w.Code != 201 {
		t.Fatalf("first call: %d", w.Code)
	}
	h.clock.Advance(time.Hour + time.Second)
	if n, err := h.mw.Cleanup(context.Background(), 0); err != nil || n != 1 {
		t.Fatalf("Cleanup at expiry = %d, %v; want the row deleted", n, err)
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{"other":1}`, "X-User", "u1"); w.Code != 201 || h.calls.Load() != 2 {
		t.Fatalf("expired key: %d, %d executions; want a new execution", w.Code, h.calls.Load())
	}
}

// TestTombstoneDecidesNotTheRoute: a tombstone written under ExpiredRefuse
// is refused by a route of the same name configured ExpiredRunAgain (an
// instance with another config): the row decides.
func TestTombstoneDecidesNotTheRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	refuse := h.route(RouteConfig{Name: "orders", TTL: time.Hour, Expired: ExpiredRefuse}, orderHandler)
	runAgain := h.route(RouteConfig{Name: "orders", TTL: time.Hour}, orderHandler)
	if w := send(t, refuse, "POST", "/orders", testKey, `{}`); w.Code != 201 {
		t.Fatalf("first call: %d", w.Code)
	}
	h.clock.Advance(time.Hour + time.Second)
	assertJSONError(t, send(t, runAgain, "POST", "/orders", testKey, `{}`), 422, keyExpiredBody)
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
}

// TestExpiredRefuseInFlight: an in_flight key past its TTL whose lease
// runs is in flight (409), not a tombstone; once the lease is over, it is.
func TestExpiredRefuseInFlight(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ctx := context.Background()
	req := ClaimRequest{Key: testKey, Endpoint: "orders", RequestHash: requestHash("POST", "/orders", "", []byte(`{}`)), TTL: time.Minute, Lease: time.Hour, Grace: 3 * time.Hour}
	if res, err := h.store.Claim(ctx, req); err != nil || !res.Won {
		t.Fatalf("claim: %v %v", res.Won, err)
	}
	rt := h.route(RouteConfig{Name: "orders", TTL: time.Hour, Expired: ExpiredRefuse}, orderHandler)
	h.clock.Advance(2 * time.Minute)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{}`), 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	h.clock.Advance(time.Hour)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{}`), 422, keyExpiredBody)
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("executions = %d, want 0", n)
	}
}

// TestExpiredConfig: Grace needs ExpiredRefuse and is at most 30 days;
// TTL is at most 30 days; an unknown policy is refused; Grace defaults to
// the TTL under ExpiredRefuse.
func TestExpiredConfig(t *testing.T) {
	t.Parallel()
	mw := newHooked(t, NewMemoryStore(), Config{})
	for _, tc := range []struct {
		rc   RouteConfig
		want string // "" accepted
	}{
		{RouteConfig{TTL: 30 * 24 * time.Hour}, ""},
		{RouteConfig{TTL: 30*24*time.Hour + time.Second}, "exceeds the maximum"},
		{RouteConfig{Expired: ExpiredRefuse, Grace: 30 * 24 * time.Hour}, ""},
		{RouteConfig{Expired: ExpiredRefuse, Grace: 30*24*time.Hour + time.Second}, "RouteConfig.Grace"},
		{RouteConfig{Expired: ExpiredRefuse, Grace: -time.Second}, "RouteConfig.Grace"},
		{RouteConfig{Grace: time.Hour}, "ExpiredRefuse only"},
		{RouteConfig{Expired: 2}, "neither ExpiredRunAgain nor ExpiredRefuse"},
	} {
		_, err := mw.Route(tc.rc)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Route(%+v) = %v, want %q", tc.rc, err, tc.want)
		}
	}
	p, err := mw.newPolicy(RouteConfig{Expired: ExpiredRefuse, TTL: 5 * time.Hour}.withDefaults())
	if err != nil || p.grace != 5*time.Hour {
		t.Fatalf("ExpiredRefuse's Grace by default = %v (%v), want the TTL, 5h", p.grace, err)
	}
	if p, _ := mw.newPolicy(RouteConfig{}.withDefaults()); p.grace != 0 {
		t.Fatalf("ExpiredRunAgain's grace = %v, want 0", p.grace)
	}
}

// TestExpiredRefuseDo: Do answers a tombstone with an *ErrorAnswer that
// errors.Is ErrKeyExpired, 422 idempotency_key_expired, without running
// the function.
func TestExpiredRefuseDo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	op, err := h.mw.Operation("settle-payment", RouteConfig{TTL: time.Hour, Expired: ExpiredRefuse, Scoped: true})
	if err != nil {
		t.Fatal(err)
	}
	call := Call{Key: testKey, Scope: "u1", Request: []byte(`{"amount":100}`)}
	var runs int
	fn := func(context.Context) (int, error) { runs++; return 7, nil }
	if _, _, err := Do(context.Background(), op, call, fn); err != nil {
		t.Fatalf("first call: %v", err)
	}
	h.clock.Advance(time.Hour + time.Second)
	_, _, err = Do(context.Background(), op, call, fn)
	var ea *ErrorAnswer
	if !errors.Is(err, ErrKeyExpired) || !errors.As(err, &ea) || ea.Status != 422 || ea.Kind != "idempotency_key_expired" {
		t.Fatalf("Do of a tombstone: %v (%T), want an *ErrorAnswer 422 idempotency_key_expired standing for ErrKeyExpired", err, err)
	}
	if runs != 1 {
		t.Fatalf("runs = %d, want 1", runs)
	}
}
