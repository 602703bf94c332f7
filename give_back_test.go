package idempotency_test

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestLostClaimReplyDoesNotStrandTheKey: the claim commits but its reply is
// lost. With one reply lost, the store's retry recognises the row by the
// request's owner token and the request runs at once (it used to read its
// own row as another request's: 409, then outcome_unknown for the whole
// TTL). With every reply lost, the request gets 503 and its handler never
// runs; the middleware then frees the row in the background, so the
// client's retry with the same key executes, once.
func TestLostClaimReplyDoesNotStrandTheKey(t *testing.T) {
	t.Parallel()

	t.Run("OneReplyLost", func(t *testing.T) {
		t.Parallel()
		rc := &replyCutter{marker: []byte("WITH ins AS (")} // pgsql.ClaimSQL
		pool := testdb.New(t, testdb.MaxConns(2), rc.option())
		var calls atomic.Int64
		h := orderRoute(t, idempotency.NewPostgresStore(pool), quiet, &calls)
		rc.cuts.Store(1)
		key := newKeys(1)[0]
		if w := do(h, key, `{"qty":1}`); w.Code != http.StatusCreated || calls.Load() != 1 {
			t.Fatalf("claim with its reply lost: %d %s, handler ran %d times; want 201, once", w.Code, w.Body, calls.Load())
		}
		if n := rc.cut.Load(); n != 1 {
			t.Fatalf("%d replies cut, want 1", n)
		}
		if w := do(h, key, `{"qty":1}`); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" || calls.Load() != 1 {
			t.Fatalf("retry: %d replayed %q, handler ran %d times; want the replay, once", w.Code, w.Header().Get(idempotency.HeaderReplayed), calls.Load())
		}
	})

	t.Run("EveryReplyLost", func(t *testing.T) {
		t.Parallel()
		rc := &replyCutter{marker: []byte("WITH ins AS (")} // pgsql.ClaimSQL
		pool := testdb.New(t, testdb.MaxConns(2), rc.option())
		freed := &signalHandler{want: "freed the key of a claim whose reply was lost", seen: make(chan struct{})}
		var calls atomic.Int64
		h := orderRoute(t, idempotency.NewPostgresStore(pool), slog.New(freed), &calls)
		rc.cuts.Store(2) // the claim and the store's one retry
		key := newKeys(1)[0]
		if w := do(h, key, `{"qty":1}`); w.Code != http.StatusServiceUnavailable || calls.Load() != 0 {
			t.Fatalf("claim with every reply lost: %d %s, handler ran %d times; want 503, not run", w.Code, w.Body, calls.Load())
		}
		select {
		case <-freed.seen:
		case <-time.After(5 * idempotency.DefaultStoreTimeout):
			t.Fatal("the key of the lost claim was never freed")
		}
		if w := do(h, key, `{"qty":1}`); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" || calls.Load() != 1 {
			t.Fatalf("retry after the key was freed: %d %s replayed %q, handler ran %d times; want a fresh 201, once",
				w.Code, w.Body, w.Header().Get(idempotency.HeaderReplayed), calls.Load())
		}
	})
}
