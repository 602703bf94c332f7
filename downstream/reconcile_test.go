package downstream_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
)

// TestKeyInReconcileHook: a Reconcile hook derives, for the stale row it
// is asked about, the ids the first run sent: the first run derives them
// and ends Unsettled; the retry's hook derives again (under the reconcile
// claim, a new attempt and owner) and answers done with them, which the
// retry gets as a replay.
func TestKeyInReconcileHook(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t, idempotency.NewMemoryStore(), downstream.TestKeyring(t, "A"), on)
	sent := make(chan ids, 1)
	rc := idempotency.RouteConfig{Name: "orders", Reconcile: func(ctx context.Context, _ idempotency.ReconcileInfo) (any, error) {
		got, err := derive(ctx)
		if err != nil {
			return nil, err
		}
		body, _ := json.Marshal(got)
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
	}}
	orders := mw.MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := derive(r.Context())
		if err != nil {
			t.Errorf("the first run derives: %v", err)
		}
		sent <- got
		idempotency.Unsettled(w, r) // the venue's answer was lost
	}))
	key := uuid.NewString()
	if _, w := post(t, orders, key, "alice"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("an unsettled first run: %d %s, want 503", w.Code, w.Body)
	}
	first := <-sent
	again, w := post(t, orders, key, "alice")
	if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("the retry after reconcile: %d replayed=%q %s, want 201 replayed", w.Code, w.Header().Get(idempotency.HeaderReplayed), w.Body)
	}
	if again != first {
		t.Errorf("the hook derived %+v, the first run sent %+v", again, first)
	}
}
