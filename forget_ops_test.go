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
