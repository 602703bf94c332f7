package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// lostClaimStore fails every claim as a timeout (the claim may have
// committed) and the first ReleaseOwner as a cut connection; the second
// frees the row.
type lostClaimStore struct {
	*MemoryStore
	releases atomic.Int64
	freed    chan struct{}
}

func (s *lostClaimStore) Claim(context.Context, ClaimRequest) (ClaimResult, error) {
	return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonTimeout, Err: context.DeadlineExceeded}
}

func (s *lostClaimStore) ReleaseOwner(context.Context, ClaimRequest) (bool, error) {
	if s.releases.Add(1) == 1 {
		return false, &StoreError{Op: "release_owner", Reason: ReasonConnection, Err: errors.New("connection cut")}
	}
	close(s.freed)
	return true, nil
}

// TestReleaseOwnerHasItsOwnOperation: the background deletion of a lost
// claim's row by its owner token is timed and counted as operation
// release_owner, never as release (a fenced release of a claim the
// middleware holds).
func TestReleaseOwnerHasItsOwnOperation(t *testing.T) {
	t.Parallel()
	s := &lostClaimStore{MemoryStore: NewMemoryStore(), freed: make(chan struct{})}
	mw, h, calls := countedRoute(t, s, RouteConfig{})
	if w := send(t, h, http.MethodPost, "/orders", "3f1e2d3c-4b5a-4e8b-a6c5-0f1e2d3c4b5a", `{}`); w.Code != http.StatusServiceUnavailable || calls.Load() != 0 {
		t.Fatalf("claim of unknown outcome: %d, handler ran %d times; want 503, not run", w.Code, calls.Load())
	}
	select {
	case <-s.freed:
	case <-time.After(5 * DefaultStoreTimeout):
		t.Fatal("the lost claim's row was never freed")
	}
	// The first, failed, deletion was counted before the second began.
	if n := testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues("release_owner", ReasonConnection)); n != 1 {
		t.Errorf("store_errors_total{operation=release_owner,reason=connection} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues("release", ReasonConnection)); n != 0 {
		t.Errorf("store_errors_total{operation=release,reason=connection} = %v, want 0: the owner's deletion is no release", n)
	}
	// timeCall times each call under the same operation (a missing one
	// would panic there).
}

// lateRowStore loses the reply of its first claim (a timeout: the claim
// may have committed), and that claim's INSERT lands late: the first
// ReleaseOwner finds no row, and the row shows up right after it. Later
// calls are the memory store's; freed closes when one deletes the row.
type lateRowStore struct {
	*MemoryStore
	claims, releases atomic.Int64
	freed            chan struct{}
}

func (s *lateRowStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if s.claims.Add(1) == 1 {
		return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonTimeout, Err: context.DeadlineExceeded}
	}
	return s.MemoryStore.Claim(ctx, req)
}

func (s *lateRowStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	if s.releases.Add(1) == 1 {
		_, err := s.MemoryStore.Claim(ctx, req) // the lost claim commits after this look found nothing
		return false, err
	}
	freed, err := s.MemoryStore.ReleaseOwner(ctx, req)
	if freed {
		close(s.freed)
	}
	return freed, err
}

// TestGiveBackLostRowShowsUpLate: the background release of a claim whose
// reply was lost keeps trying when the row shows up after its first look
// (an answer of "no row" counts only once the lost claim must have ended
// on the server), so the client's retry executes instead of meeting a key
// in flight whose handler never ran.
func TestGiveBackLostRowShowsUpLate(t *testing.T) {
	t.Parallel()
	s := &lateRowStore{MemoryStore: NewMemoryStore(), freed: make(chan struct{})}
	mw := newHooked(t, s, Config{Lease: 10 * time.Second, StoreTimeout: 100 * time.Millisecond})
	var calls atomic.Int64
	h := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	if w := send(t, h, http.MethodPost, "/orders", testKey, `{}`); w.Code != http.StatusServiceUnavailable || calls.Load() != 0 {
		t.Fatalf("claim of unknown outcome: %d, handler ran %d times; want 503, not run", w.Code, calls.Load())
	}
	select {
	case <-s.freed:
	case <-time.After(10 * time.Second): // the release loop ends two store timeouts (200ms) after the claim
		t.Fatalf("the lost claim's row, which showed up after the first of %d looks, was never freed", s.releases.Load())
	}
	if w := send(t, h, http.MethodPost, "/orders", testKey, `{}`); w.Code != http.StatusCreated || calls.Load() != 1 {
		t.Fatalf("the retry: %d %s, handler ran %d times; want 201, once", w.Code, w.Body, calls.Load())
	}
}
