package idempotency_test

import (
	"context"
	"net/http"
	"sync"
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

// stuckReleaseStore answers its first claim late (past the handler's
// deadline) and fails every release until healed; the first release after
// that is reported on released.
type stuckReleaseStore struct {
	*idempotency.PostgresStore
	delay    time.Duration
	slowed   atomic.Bool
	healed   chan struct{}
	released chan struct{} // closed by the first release that reached the store after heal
	once     sync.Once
}

func (s *stuckReleaseStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.PostgresStore.Claim(ctx, req)
	if s.slowed.CompareAndSwap(false, true) {
		time.Sleep(s.delay) // a slow reply, not synchronisation
	}
	return res, err
}

// stuck fails op until healed; after that it reports the first release
// that reached the store (called once the release returned).
func (s *stuckReleaseStore) stuck(op string) (reached func(), err error) {
	select {
	case <-s.healed:
		return func() { s.once.Do(func() { close(s.released) }) }, nil
	default:
		return nil, &idempotency.StoreError{Op: op, Reason: idempotency.ReasonTimeout, Err: context.DeadlineExceeded}
	}
}

func (s *stuckReleaseStore) Release(ctx context.Context, f idempotency.Fence) error {
	reached, err := s.stuck("release")
	if err != nil {
		return err
	}
	defer reached()
	return s.PostgresStore.Release(ctx, f)
}

// ReleaseOwner fails the same way: on a loaded machine the claim itself
// can time out (its reply lost to the engine), and the key is then given
// back by owner token, the other release.
func (s *stuckReleaseStore) ReleaseOwner(ctx context.Context, req idempotency.ClaimRequest) (bool, error) {
	reached, err := s.stuck("release_owner")
	if err != nil {
		return false, err
	}
	defer reached()
	return s.PostgresStore.ReleaseOwner(ctx, req)
}

// TestPostgresTooLateReleaseOutlastsAnOutage: when the claim left the
// handler no time and the store keeps failing the release for longer than
// the client waits (two store timeouts), the release carries on in the
// background, so once the store answers again the key is free and the
// retry executes: nothing ran. Before, the release gave up after two store
// timeouts and the key answered outcome_unknown for its whole TTL.
func TestPostgresTooLateReleaseOutlastsAnOutage(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := &stuckReleaseStore{PostgresStore: idempotency.NewPostgresStore(pool), delay: 450 * time.Millisecond,
		healed: make(chan struct{}), released: make(chan struct{})}
	mw, err := idempotency.New(s, idempotency.Config{Lease: 600 * time.Millisecond, StoreTimeout: 200 * time.Millisecond,
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
	close(s.healed) // the store answers again, after the client had its 503
	select {
	case <-s.released: // the row is deleted by then
	case <-time.After(10 * time.Second): // the background retries at least once a second
		t.Fatal("no release reached the store once it answered again: the key stays in flight, outcome_unknown for its TTL")
	}
	if w := do(h, key, `{}`); w.Code != http.StatusCreated || calls.Load() != 1 {
		t.Fatalf("retry after the store recovered: %d %s, %d executions; want 201 from the one execution", w.Code, w.Body, calls.Load())
	}
}
