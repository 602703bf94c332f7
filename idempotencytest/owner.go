package idempotencytest

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
)

// runOwner checks owner tokens (ClaimRequest.Owner and
// idempotency.Store.ReleaseOwner).
func runOwner(t *testing.T, setup setupFunc) {
	t.Run("Owner", func(t *testing.T) {
		t.Parallel()

		t.Run("OwnClaimWinsAgain", func(t *testing.T) { ownerOwnClaimWinsAgain(t, setup) })

		t.Run("NoTokenNeverOwns", func(t *testing.T) { ownerNoTokenNeverOwns(t, setup) })

		for _, fin := range []ownerFinish{
			{"Completed", func(s idempotency.Store, ctx context.Context, r idempotency.Record) error {
				return s.Complete(ctx, r.Fence(), r, jsonResponse())
			}, idempotency.StatusCompleted},
			{"Failed", func(s idempotency.Store, ctx context.Context, r idempotency.Record) error {
				return s.Fail(ctx, r.Fence())
			}, idempotency.StatusFailed},
		} {
			t.Run("Not"+fin.name+"Row", func(t *testing.T) { ownerNotFinishedRow(t, setup, fin) })
		}

		t.Run("NotWonAfterLeaseOver", func(t *testing.T) { ownerNotWonAfterLeaseOver(t, setup) })

		t.Run("ReleaseOwnerDeletesOnlyItsInFlightRow", func(t *testing.T) { ownerReleaseOwnerDeletesOnlyItsInFlightRow(t, setup) })

		t.Run("TakeoverCarriesItsOwner", func(t *testing.T) { ownerTakeoverCarriesItsOwner(t, setup) })

		t.Run("TakeoverWithoutTokenClearsIt", func(t *testing.T) { ownerTakeoverWithoutTokenClearsIt(t, setup) })

		t.Run("FencedCallsNeedTheScope", func(t *testing.T) { ownerFencedCallsNeedTheScope(t, setup) })
	})
}

// ownerOwnClaimWinsAgain is the subtest Owner/OwnClaimWinsAgain.
func ownerOwnClaimWinsAgain(t *testing.T, setup setupFunc) {
	// The claim's reply was lost: the same request claims again and
	// gets its own row as won, unchanged; anyone else reads it.
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, longLease)
	first := MustClaim(t, s, req)
	res, err := s.Claim(ctx, req)
	if err != nil || !res.Won {
		t.Fatalf("Claim again with the owner token: won %v, %v; want won", res.Won, err)
	}
	sameRecord(t, "own claim read again", res.Record, first)
	if res.Record.Fence() != first.Fence() {
		t.Errorf("own claim's fence %+v, want %+v", res.Record.Fence(), first.Fence())
	}
	other := req
	other.Owner = uuid.New()
	if res, err := s.Claim(ctx, other); err != nil || res.Won {
		t.Errorf("Claim with another owner token: won %v, %v; want lost", res.Won, err)
	}
	sameRecord(t, "row read without a token", Read(t, s, unowned(req)), first)
}

// ownerNoTokenNeverOwns is the subtest Owner/NoTokenNeverOwns.
func ownerNoTokenNeverOwns(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	req := Request("user-1", longTTL, longLease) // no owner
	first := MustClaim(t, s, req)
	sameRecord(t, "second claim without a token", Read(t, s, req), first)
}

// ownerFinish finishes an owned row one way, leaving it in status.
type ownerFinish struct {
	name   string
	finish func(idempotency.Store, context.Context, idempotency.Record) error
	status idempotency.Status
}

// ownerNotFinishedRow is the subtest Owner/NotCompletedRow or
// Owner/NotFailedRow, as fin finishes the row.
func ownerNotFinishedRow(t *testing.T, setup setupFunc, fin ownerFinish) {
	// A finished row is never won again nor released, even by
	// its owner: its handler ran.
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, longLease)
	rec := MustClaim(t, s, req)
	if err := fin.finish(s, ctx, rec); err != nil {
		t.Fatalf("finish: %v", err)
	}
	res, err := s.Claim(ctx, req)
	if err != nil || res.Won || res.Record.Status != fin.status {
		t.Fatalf("Claim of its own %s row: won %v status %q, %v; want lost, %q", fin.name, res.Won, res.Record.Status, err, fin.status)
	}
	released, err := s.ReleaseOwner(ctx, req)
	if err != nil || released {
		t.Fatalf("ReleaseOwner of a %s row: %v, %v; want false", fin.name, released, err)
	}
	if got := Read(t, s, unowned(req)); got.Status != fin.status {
		t.Errorf("row after ReleaseOwner: status %q, want %q", got.Status, fin.status)
	}
}

// ownerNotWonAfterLeaseOver is the subtest Owner/NotWonAfterLeaseOver.
func ownerNotWonAfterLeaseOver(t *testing.T, setup setupFunc) {
	// The lease ran out: the owner's claim is stale, not won again;
	// ReleaseOwner may still free it, the handler never having run.
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, tiny)
	MustClaim(t, s, req)
	stale := WaitFor(t, s, unowned(req), "lease over", isLeaseOver)
	res, err := s.Claim(ctx, req)
	if err != nil || res.Won {
		t.Fatalf("Claim of its own row after the lease: won %v, %v; want lost", res.Won, err)
	}
	if res.Record.Fence() != stale.Fence() {
		t.Errorf("row changed: fence %+v, want %+v", res.Record.Fence(), stale.Fence())
	}
	released, err := s.ReleaseOwner(ctx, req)
	if err != nil || !released {
		t.Fatalf("ReleaseOwner of its stale in_flight row: %v, %v; want true", released, err)
	}
	checkFresh(t, MustClaim(t, s, unowned(req)), req, 1)
}

// ownerReleaseOwnerDeletesOnlyItsInFlightRow is the subtest Owner/ReleaseOwnerDeletesOnlyItsInFlightRow.
func ownerReleaseOwnerDeletesOnlyItsInFlightRow(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	r := s
	req := ownedRequest("user-1", longTTL, longLease)
	rec := MustClaim(t, s, req)
	neighbour := req // the same key of another endpoint, same token
	neighbour.Endpoint = otherEndpoint
	nrec := MustClaim(t, s, neighbour)

	wrong := map[string]func(*idempotency.ClaimRequest){
		"another token": func(q *idempotency.ClaimRequest) { q.Owner = uuid.New() },
		"no token":      func(q *idempotency.ClaimRequest) { q.Owner = uuid.Nil },
		"another scope": func(q *idempotency.ClaimRequest) { q.Scope = "user-2" },
		"no scope":      func(q *idempotency.ClaimRequest) { q.Scope = "" },
		"another key":   func(q *idempotency.ClaimRequest) { q.Key = NewKey() },
		"another endpoint": func(q *idempotency.ClaimRequest) {
			q.Endpoint = "POST /api/other"
		},
	}
	for what, change := range wrong {
		q := req
		change(&q)
		released, err := r.ReleaseOwner(ctx, q)
		if err != nil || released {
			t.Errorf("ReleaseOwner with %s: %v, %v; want false", what, released, err)
		}
	}
	sameRecord(t, "row after the refused releases", Read(t, s, unowned(req)), rec)

	released, err := r.ReleaseOwner(ctx, req)
	if err != nil || !released {
		t.Fatalf("ReleaseOwner with the owner token: %v, %v; want true", released, err)
	}
	if released, err := r.ReleaseOwner(ctx, req); err != nil || released {
		t.Errorf("second ReleaseOwner: %v, %v; want false", released, err)
	}
	// Only that row went: the other endpoint's row stays.
	sameRecord(t, "the other endpoint's row", Read(t, s, unowned(neighbour)), nrec)
	if ids := exportIDs(t, s, req.Scope); len(ids) != 1 || !ids[nrec.ID] {
		t.Errorf("rows of the scope after ReleaseOwner: %v, want only %d", ids, nrec.ID)
	}
	// The key is free: a new request claims it as new.
	next := req
	next.Owner = uuid.New()
	checkFresh(t, MustClaim(t, s, next), next, 1)
}

// ownerTakeoverCarriesItsOwner is the subtest Owner/TakeoverCarriesItsOwner.
func ownerTakeoverCarriesItsOwner(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	r := s
	first := ownedRequest("user-1", tiny, tiny)
	rec := MustClaim(t, s, first)
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
		t.Fatal(err)
	}
	expired := WaitFor(t, s, unowned(first), "expired", isExpired)
	second := first
	second.TTL, second.Lease, second.Owner = longTTL, longLease, uuid.New()
	res, err := s.Takeover(ctx, expired.Fence(), second)
	if err != nil || !res.Won {
		t.Fatalf("Takeover: %+v, %v", res, err)
	}
	if got, err := s.Claim(ctx, first); err != nil || got.Won {
		t.Errorf("Claim with the first owner's token after a takeover: won %v, %v; want lost", got.Won, err)
	}
	if got, err := s.Claim(ctx, second); err != nil || !got.Won || got.Record.Fence() != res.Record.Fence() {
		t.Errorf("Claim with the new owner's token: won %v fence %+v, %v; want won, %+v", got.Won, got.Record.Fence(), err, res.Record.Fence())
	}
	if released, err := r.ReleaseOwner(ctx, first); err != nil || released {
		t.Errorf("ReleaseOwner by the first owner after a takeover: %v, %v; want false", released, err)
	}
	if released, err := r.ReleaseOwner(ctx, second); err != nil || !released {
		t.Errorf("ReleaseOwner by the new owner: %v, %v; want true", released, err)
	}
}

// ownerTakeoverWithoutTokenClearsIt is the subtest Owner/TakeoverWithoutTokenClearsIt.
func ownerTakeoverWithoutTokenClearsIt(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	first := ownedRequest("user-1", tiny, tiny)
	rec := MustClaim(t, s, first)
	if err := s.Fail(ctx, rec.Fence()); err != nil {
		t.Fatal(err)
	}
	expired := WaitFor(t, s, unowned(first), "expired", isExpired)
	second := unowned(first)
	second.TTL, second.Lease = longTTL, longLease
	if res, err := s.Takeover(ctx, expired.Fence(), second); err != nil || !res.Won {
		t.Fatalf("Takeover: %+v, %v", res, err)
	}
	if released, err := s.ReleaseOwner(ctx, first); err != nil || released {
		t.Errorf("ReleaseOwner by the first owner after a takeover without a token: %v, %v; want false", released, err)
	}
}

// ownerFencedCallsNeedTheScope is the subtest Owner/FencedCallsNeedTheScope.
func ownerFencedCallsNeedTheScope(t *testing.T, setup setupFunc) {
	// A fence names the row's scope: with another one, a takeover
	// changes nothing.
	s, _ := setup(t)
	req := Request("user-1", tiny, tiny)
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "expired, lease over", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
	for _, scope := range []string{"", "user-2"} {
		f := rec.Fence()
		f.Scope = scope
		takeover.lost(t, s, f, newRequest("user-1"), fmt.Sprintf("with the scope %q", scope))
	}
	sameRecord(t, "row after the refused calls", Read(t, s, req), rec)
}
