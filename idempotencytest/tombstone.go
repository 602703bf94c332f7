package idempotencytest

import (
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// grace is the tombstone time of the suite's ExpiredRefuse rows: long
// enough for the steps a test takes while the row is a tombstone, short
// enough to wait out.
const grace = 3 * time.Second

// runTombstone checks the rows a claim with a Grace leaves (ExpiredRefuse,
// DESIGN.md "Keys in time"): a tombstone from expires_at on, never taken
// over, its response purged by Cleanup at expiry and the row deleted after
// the grace; a claim without one, as before.
func runTombstone(t *testing.T, setup setupFunc) {
	t.Run("Tombstone", func(t *testing.T) {
		t.Parallel()

		t.Run("RefusedPurgedThenDeleted", func(t *testing.T) { tombstoneRefusedPurgedThenDeleted(t, setup) })

		t.Run("TakenOverAfterGrace", func(t *testing.T) { tombstoneTakenOverAfterGrace(t, setup) })

		t.Run("NoGraceNoTombstone", func(t *testing.T) { tombstoneNoGraceNoTombstone(t, setup) })

		t.Run("CleanupKeepsLiveLease", func(t *testing.T) { tombstoneCleanupKeepsLiveLease(t, setup) })
	})
}

// tombstoneRequest returns a claim of a new key that expires at once and
// stays a tombstone for the suite's grace.
func tombstoneRequest() idempotency.ClaimRequest {
	req := Request("user-1", tiny, longLease)
	req.Grace = grace
	return req
}

// isTombstone reports a row read as a tombstone.
func isTombstone(r idempotency.Record) bool { return r.Tombstone }

// tombstoneRefusedPurgedThenDeleted is the subtest Tombstone/RefusedPurgedThenDeleted.
func tombstoneRefusedPurgedThenDeleted(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := tombstoneRequest()
	rec := MustClaim(t, s, req)
	if rec.Tombstone {
		t.Fatalf("a fresh claim is a tombstone: %+v", rec)
	}
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	old := WaitFor(t, s, req, "expired", isExpired)
	if !old.Tombstone {
		t.Fatalf("an expired row claimed with Grace %v: Tombstone false, want true: %+v", grace, old)
	}

	// Never taken over while it is one.
	next := req
	next.RequestHash = HashOf("another request")
	next.TTL, next.Grace = longTTL, 0
	if res, err := s.Takeover(ctx, old.Fence(), next); err != nil || res.Won || !res.Lost {
		t.Fatalf("Takeover of a tombstone = Won %v Lost %v, %v; want lost", res.Won, res.Lost, err)
	}

	// Cleanup purges its response and keeps the row.
	if _, err := s.Cleanup(ctx, 100); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	got := Read(t, s, req)
	switch {
	case !got.Tombstone || got.ID != old.ID || got.Status != idempotency.StatusCompleted || got.RequestHash != req.RequestHash:
		t.Fatalf("after Cleanup, the tombstone is %+v, want row %d completed with its hash", got, old.ID)
	case got.Response.Body != nil || got.Response.Header != nil || got.Response.SealKeyID != "" || got.Response.BodyKind != idempotency.BodyNone:
		t.Errorf("after Cleanup, the tombstone keeps its response: %+v", got.Response)
	case got.Response.Status != jsonResponse().Status:
		t.Errorf("after Cleanup, the tombstone's status code is %d, want %d kept", got.Response.Status, jsonResponse().Status)
	}

	// After the grace: no longer a tombstone, and Cleanup deletes it.
	WaitFor(t, s, req, "past its grace", func(r idempotency.Record) bool { return !r.Tombstone })
	deadline := time.Now().Add(waitBound)
	for len(exportIDs(t, s, req.Scope)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the tombstone is still there %v after its grace", waitBound)
		}
		if _, err := s.Cleanup(ctx, 100); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
	}
	checkFresh(t, MustClaim(t, s, req), req, 1)
}

// tombstoneTakenOverAfterGrace is the subtest Tombstone/TakenOverAfterGrace:
// before cleanup deletes it, a row past its grace is a new key for a
// takeover.
func tombstoneTakenOverAfterGrace(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := tombstoneRequest()
	req.Grace = 50 * time.Millisecond
	rec := MustClaim(t, s, req)
	if err := s.Fail(ctx, rec.Fence()); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	old := WaitFor(t, s, req, "expired past its grace", func(r idempotency.Record) bool { return r.Expired && !r.Tombstone })
	next := req
	next.TTL, next.Grace = longTTL, 0
	res, err := s.Takeover(ctx, old.Fence(), next)
	if err != nil || !res.Won {
		t.Fatalf("Takeover after the grace = Won %v, %v; want won", res.Won, err)
	}
	checkFresh(t, res.Record, next, old.Attempt+1)
}

// tombstoneNoGraceNoTombstone is the subtest Tombstone/NoGraceNoTombstone:
// without a grace an expired row is no tombstone, and Cleanup deletes it
// at once.
func tombstoneNoGraceNoTombstone(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := Request("user-1", tiny, longLease)
	rec := MustClaim(t, s, req)
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got := WaitFor(t, s, req, "expired", isExpired); got.Tombstone {
		t.Fatalf("an expired row without grace is a tombstone: %+v", got)
	}
	if n, err := s.Cleanup(ctx, 100); err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want 1, nil", n, err)
	}
	if left := exportIDs(t, s, req.Scope); len(left) != 0 {
		t.Fatalf("Cleanup left %d rows, want none", len(left))
	}
}

// tombstoneCleanupKeepsLiveLease is the subtest
// Tombstone/CleanupKeepsLiveLease: an in_flight row whose lease runs
// stays, past its expiry and its grace alike, and its owner records; it
// is a tombstone once the lease is over.
func tombstoneCleanupKeepsLiveLease(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	past := Request("user-1", tiny, longTTL) // past retain_until at once, lease running
	past.Grace = tiny
	inGrace := Request("user-1", tiny, longTTL) // a tombstone-to-be, lease running
	inGrace.Grace = longTTL
	recPast, recGrace := MustClaim(t, s, past), MustClaim(t, s, inGrace)
	WaitFor(t, s, past, "past its grace", func(r idempotency.Record) bool { return r.Expired && !r.Tombstone })
	WaitFor(t, s, inGrace, "a tombstone", isTombstone)
	if n, err := s.Cleanup(ctx, 100); err != nil || n != 0 {
		t.Fatalf("Cleanup with two live leases = %d, %v; want 0, nil", n, err)
	}
	if left := exportIDs(t, s, "user-1"); len(left) != 2 {
		t.Fatalf("Cleanup deleted a row whose lease runs: %d rows left, want 2", len(left))
	}
	for _, rec := range []idempotency.Record{recPast, recGrace} {
		if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
			t.Errorf("Complete by the live owner after Cleanup: %v", err)
		}
	}
}
