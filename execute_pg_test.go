package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresTooLateReleaseRetried: when the claim left the handler no
// time, the key is released (nothing ran) and the client gets 503; a
// release that fails once is tried again, so the key is not stranded in
// flight (which would answer outcome_unknown for its whole TTL although
// the handler never ran). Found by a review: the release had one attempt.
func TestPostgresTooLateReleaseRetried(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := &slowThenFailingStore{PostgresStore: idempotency.NewPostgresStore(pool), delay: 150 * time.Millisecond}
	mw, err := idempotency.New(s, idempotency.Config{Lease: 300 * time.Millisecond, StoreTimeout: 200 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != http.StatusServiceUnavailable || calls.Load() != 0 {
		t.Fatalf("setup: first answer %d %s, %d executions; want 503 and none", w.Code, w.Body, calls.Load())
	}
	// As if the lease had passed (the client retried a little later).
	if _, err := pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET locked_until = now() - interval '1 millisecond' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	w := do(h, key, `{}`)
	if w.Code != http.StatusCreated || calls.Load() != 1 {
		t.Errorf("retry of a request answered 503 (handler not run): %d %s, %d executions; the key is stranded in flight",
			w.Code, w.Body, calls.Load())
	}
}
