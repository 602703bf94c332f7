package idempotencytest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// The reconcile part, run through a middleware over the store: a key left
// Unsettled has its lease ended (EndLease), its retry takes the fenced
// reconcile claim (ClaimStale) and, with one reconciler at a time, asks
// the hook; ReconcileStale finds the endpoint's stale keys (Stale). A
// store without those methods skips it.

// runReconcile runs the reconcile subtests.
func runReconcile(t *testing.T, setup setupFunc) {
	t.Run("Reconcile", func(t *testing.T) {
		t.Parallel()
		t.Run("UnsettledThenDone", func(t *testing.T) { reconcileUnsettledThenDone(t, setup) })
		t.Run("OneReconcilerAtATime", func(t *testing.T) { reconcileOneAtATime(t, setup) })
		t.Run("StaleKeysInBulk", func(t *testing.T) { reconcileStaleInBulk(t, setup) })
	})
}

// reconcileCfg is the middleware of the reconcile subtests.
var reconcileCfg = idempotency.Config{Lease: 10 * time.Second, StoreTimeout: 2 * time.Second,
	Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	Enabled: func(context.Context) bool { return true }}

// venueOrder is a done hook's answer.
var venueOrder = idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"order":"venue"}`)}

// unsettledRoute is a route over s whose handler ends Unsettled, with
// hook; runs counts the handler's runs. It skips a store without the
// reconcile methods.
func unsettledRoute(t *testing.T, s idempotency.Store, name string, hook func(context.Context, idempotency.ReconcileInfo) (any, error)) (http.Handler, *atomic.Int64) {
	t.Helper()
	mw, err := idempotency.New(s, reconcileCfg)
	if err != nil {
		t.Fatal(err)
	}
	route, err := mw.Route(idempotency.RouteConfig{Name: name, Reconcile: hook})
	if err != nil && strings.Contains(err.Error(), "EndLease, ClaimStale and Stale") {
		t.Skip("the store has no EndLease, ClaimStale and Stale:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		idempotency.Unsettled(w, r)
	})), runs
}

// post sends a POST with key through h.
func post(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"qty":1}`))
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// reconcileUnsettledThenDone: Unsettled answers 503 with Retry-After 1;
// the retry reconciles at once (the lease was ended) and replays the
// hook's order, recorded: the next retry replays it without the hook.
func reconcileUnsettledThenDone(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	var asked atomic.Int64
	h, runs := unsettledRoute(t, s, endpoint, func(context.Context, idempotency.ReconcileInfo) (any, error) {
		asked.Add(1)
		return venueOrder, nil
	})
	key := NewKey()
	if w := post(h, key); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("unsettled: %d Retry-After %q, want 503 with 1", w.Code, w.Header().Get("Retry-After"))
	}
	for i := range 2 {
		if w := post(h, key); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("retry %d: %d %s, want the hook's order replayed", i+1, w.Code, w.Body)
		}
	}
	if asked.Load() != 1 || runs.Load() != 1 {
		t.Fatalf("hook asked %d times, handler ran %d; want 1 and 1", asked.Load(), runs.Load())
	}
}

// reconcileOneAtATime: racers retry one stale key while the hook holds
// the reconcile claim: one hook call, every other racer 409 in flight.
func reconcileOneAtATime(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	var asked atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	h, _ := unsettledRoute(t, s, endpoint, func(context.Context, idempotency.ReconcileInfo) (any, error) {
		if asked.Add(1) == 1 {
			close(entered)
		}
		<-release
		return venueOrder, nil
	})
	key := NewKey()
	post(h, key)
	done := make(chan int, 1)
	go func() { done <- post(h, key).Code }()
	<-entered
	race(racers, func(int) {
		if c := post(h, key).Code; c != http.StatusConflict {
			t.Errorf("a racer got %d while the key was being reconciled, want 409", c)
		}
	})
	close(release)
	if c := <-done; c != http.StatusCreated || asked.Load() != 1 {
		t.Fatalf("the reconciler got %d, hook asked %d times; want 201 and 1", c, asked.Load())
	}
}

// reconcileStaleInBulk: ReconcileStale reconciles the stale keys of its
// endpoint only: unknown leaves them stale, not done releases them.
func reconcileStaleInBulk(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	h, _ := unsettledRoute(t, s, endpoint, nil)
	other, _ := unsettledRoute(t, s, otherEndpoint, nil)
	keys := []string{NewKey(), NewKey(), NewKey()}
	for _, k := range keys {
		post(h, k)
	}
	post(other, NewKey())
	mw, err := idempotency.New(s, reconcileCfg)
	if err != nil {
		t.Fatal(err)
	}
	answer := errors.New("venue unreachable")
	rc := idempotency.RouteConfig{Reconcile: func(context.Context, idempotency.ReconcileInfo) (any, error) { return nil, answer }}
	if done, released, unknown, err := mw.ReconcileStale(ctx, endpoint, rc, 2); err != nil || done+released != 0 || unknown != 2 {
		t.Fatalf("unknown: %d done, %d released, %d unknown, %v; want 2 unknown (the limit)", done, released, unknown, err)
	}
	answer = idempotency.ErrNotDone
	if done, released, unknown, err := mw.ReconcileStale(ctx, endpoint, rc, 10); err != nil || done+unknown != 0 || released != 3 {
		t.Fatalf("not done: %d done, %d released, %d unknown, %v; want 3 released", done, released, unknown, err)
	}
	if _, _, _, err := mw.ReconcileStale(ctx, endpoint, rc, 0); err == nil {
		t.Fatal("a limit of 0 was accepted")
	}
	for _, k := range keys {
		if c := post(h, k).Code; c != http.StatusServiceUnavailable {
			t.Fatalf("a released key answered %d, want the handler's run again (503 Unsettled)", c)
		}
	}
}
