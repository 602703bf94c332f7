package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// answerWait bounds each wait of these tests for an answer: generous,
// many times the store timeout; it only proves nothing hangs.
const answerWait = 30 * time.Second

// doWithin is do with its own deadline: a request that gets no answer
// within wait fails the test by name instead of hanging it (a store call
// without its deadline).
func doWithin(t *testing.T, what string, wait time.Duration, h http.Handler, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, key)
	w := serveWithin(h, r, wait)
	if w.Code == statusNoAnswer {
		t.Fatalf("%s: %s", what, w.Body)
	}
	return w
}

// TestTakeoverOfACrashedOwner: a crashed owner's row, in flight with its
// lease and its expiry both run out, is a new key: the next request takes
// it over and runs (attempt 2), on a plain and on a transactional route.
// The crashed owner is a plain request whose handler is held (its process
// as good as gone); released at the end, its outcome is refused, since the
// key was taken over.
func TestTakeoverOfACrashedOwner(t *testing.T) {
	t.Parallel()
	for _, tx := range []bool{false, true} {
		t.Run(fmt.Sprintf("Transactional=%v", tx), func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
				Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			started, hold := make(chan struct{}), make(chan struct{})
			crashed := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				close(started)
				<-hold
				w.WriteHeader(http.StatusCreated)
			}))
			next := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: tx})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				if _, ok := idempotency.TxFromContext(r.Context()); ok != tx {
					t.Errorf("TxFromContext: %v on a route with Transactional %v", ok, tx)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			key := uuid.NewString()
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- do(crashed, key, `{"qty":1}`) }()
			released := false
			release := func() {
				if !released {
					released = true
					close(hold)
					select { // the handler returns at once; its settle calls have the store's deadline
					case <-first:
					case <-time.After(answerWait):
						t.Errorf("the crashed owner's request: no answer within %v of its release", answerWait)
					}
				}
			}
			defer release()
			select {
			case <-started:
			case <-time.After(answerWait):
				t.Fatal("the first request's handler never started")
			}
			ctx, cancel := context.WithTimeout(context.Background(), answerWait)
			defer cancel()
			if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second',
				expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1 AND status = 'in_flight'`, key); err != nil {
				t.Fatal(err)
			}
			if w := doWithin(t, "the request after the crash", answerWait, next, key, `{"qty":1}`); w.Code != http.StatusCreated || calls.Load() != 2 {
				t.Fatalf("the request after the crash: %d %s, %d executions; want 201 from its own run (the crashed owner's row taken over)",
					w.Code, w.Body, calls.Load())
			}
			var attempt int
			var status string
			if err := pool.QueryRow(ctx, `SELECT attempt, status FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&attempt, &status); err != nil {
				t.Fatal(err)
			}
			if attempt != 2 || status != "completed" {
				t.Fatalf("the row after the takeover: attempt %d, %s; want attempt 2, completed", attempt, status)
			}
			release()
			if w := doWithin(t, "a retry", answerWait, next, key, `{"qty":1}`); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" || calls.Load() != 2 {
				t.Fatalf("a retry after the crashed owner ended: %d replayed %q, %d executions; want the takeover's replay",
					w.Code, w.Header().Get(idempotency.HeaderReplayed), calls.Load())
			}
		})
	}
}
