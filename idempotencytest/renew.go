package idempotencytest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
)

// runRenew checks idempotency.Store.Renew, the Heartbeat's renewal: it
// moves the lease of the row its fence and owner token own, in flight
// inside its lease, and nothing else.
func runRenew(t *testing.T, setup setupFunc) {
	t.Run("Renew", func(t *testing.T) {
		t.Parallel()

		t.Run("ExtendsItsOwnLease", func(t *testing.T) { renewExtendsItsOwnLease(t, setup) })

		t.Run("RefusesAnyoneElse", func(t *testing.T) { renewRefusesAnyoneElse(t, setup) })

		t.Run("NeverRevivesALapsedLease", func(t *testing.T) { renewNeverRevivesALapsedLease(t, setup) })

		t.Run("RefusesAfterTakeover", func(t *testing.T) { renewRefusesAfterTakeover(t, setup) })
	})
}

// renewExtendsItsOwnLease is the subtest Renew/ExtendsItsOwnLease.
func renewExtendsItsOwnLease(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, 2*time.Second)
	rec := MustClaim(t, s, req)
	if err := s.Renew(ctx, rec.Fence(), renewal(req.Owner, longLease)); err != nil {
		t.Fatalf("Renew of its own claim: %v", err)
	}
	got := Read(t, s, unowned(req))
	if min := rec.LockedUntil.Add(longLease - 2*time.Second - time.Second); got.LockedUntil.Before(min) {
		t.Errorf("locked_until %v after Renew(%v), want at least %v (was %v)", got.LockedUntil, longLease, min, rec.LockedUntil)
	}
	if got.Fence() != rec.Fence() || got.Status != idempotency.StatusInFlight || !got.ExpiresAt.Equal(rec.ExpiresAt) ||
		!got.LockedAt.Equal(rec.LockedAt) || got.RequestHash != rec.RequestHash {
		t.Errorf("Renew changed more than the lease: %+v, was %+v", got, rec)
	}
	// Renewed, the owner still finishes as the owner.
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
		t.Fatalf("Complete after Renew: %v", err)
	}
}

// renewRefusesAnyoneElse is the subtest Renew/RefusesAnyoneElse.
func renewRefusesAnyoneElse(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, longLease)
	rec := MustClaim(t, s, req)
	stale := rec.Fence()
	stale.Attempt++
	other := rec.Fence()
	other.ID += 1000
	for name, call := range map[string]func() error{
		"another owner token": func() error { return s.Renew(ctx, rec.Fence(), renewal(uuid.New(), longLease)) },
		"no owner token":      func() error { return s.Renew(ctx, rec.Fence(), renewal(uuid.Nil, longLease)) },
		"another attempt":     func() error { return s.Renew(ctx, stale, renewal(req.Owner, longLease)) },
		"another row id":      func() error { return s.Renew(ctx, other, renewal(req.Owner, longLease)) },
	} {
		if err := call(); !errors.Is(err, idempotency.ErrNotOwner) {
			t.Errorf("Renew with %s: %v, want ErrNotOwner", name, err)
		}
	}
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, rec.Fence(), renewal(req.Owner, longLease)); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Renew of a completed row: %v, want ErrNotOwner", err)
	}
	if got := Read(t, s, unowned(req)); !got.LockedUntil.Equal(rec.LockedUntil) {
		t.Errorf("a refused Renew moved locked_until to %v, was %v", got.LockedUntil, rec.LockedUntil)
	}
}

// renewNeverRevivesALapsedLease is the subtest Renew/NeverRevivesALapsedLease.
func renewNeverRevivesALapsedLease(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := ownedRequest("user-1", longTTL, tiny)
	rec := MustClaim(t, s, req)
	WaitFor(t, s, unowned(req), "lease over", isLeaseOver)
	if err := s.Renew(ctx, rec.Fence(), renewal(req.Owner, longLease)); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("Renew after the lease ran out: %v, want ErrNotOwner", err)
	}
	if got := Read(t, s, unowned(req)); !got.LeaseOver {
		t.Errorf("a refused Renew revived the lease: locked_until %v", got.LockedUntil)
	}
}

// renewRefusesAfterTakeover is the subtest Renew/RefusesAfterTakeover.
func renewRefusesAfterTakeover(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := ownedRequest("user-1", tiny, tiny)
	rec := MustClaim(t, s, req)
	stale := WaitFor(t, s, unowned(req), "expired, lease over", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
	next := ownedRequest("user-1", longTTL, longLease)
	next.Key = req.Key
	res, err := s.Takeover(ctx, stale.Fence(), next)
	if err != nil || !res.Won {
		t.Fatalf("Takeover: won %v, %v", res.Won, err)
	}
	if err := s.Renew(ctx, rec.Fence(), renewal(req.Owner, longLease)); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("the first owner's Renew after a takeover: %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, res.Record.Fence(), renewal(req.Owner, longLease)); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Renew of the new attempt with the first owner's token: %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, res.Record.Fence(), renewal(next.Owner, longLease)); err != nil {
		t.Errorf("the new owner's Renew: %v", err)
	}
}

// renewal is a Renew request: owner's token and the lease to set.
func renewal(owner uuid.UUID, lease time.Duration) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Owner: owner, Lease: lease}
}
