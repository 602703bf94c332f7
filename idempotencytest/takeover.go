package idempotencytest

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// runTakeover checks how a row that is not the caller's is claimed again:
// Takeover of an expired row, Reclaim of a stale transactional one, and the
// Expired and LeaseOver flags they depend on.
func runTakeover(t *testing.T, setup setupFunc) {
	t.Run("Takeover", func(t *testing.T) {
		t.Parallel()

		finishes := []struct {
			name   string
			finish func(t *testing.T, s idempotency.Store, f idempotency.Fence)
		}{
			{"Completed", func(t *testing.T, s idempotency.Store, f idempotency.Fence) {
				if err := s.Complete(t.Context(), f, jsonResponse()); err != nil {
					t.Fatalf("Complete: %v", err)
				}
			}},
			{"Failed", func(t *testing.T, s idempotency.Store, f idempotency.Fence) {
				if err := s.Fail(t.Context(), f); err != nil {
					t.Fatalf("Fail: %v", err)
				}
			}},
			{"InFlight", func(*testing.T, idempotency.Store, idempotency.Fence) {}},
		}
		for _, fin := range finishes {
			t.Run("Expired"+fin.name+"RowIsTakenOver", func(t *testing.T) {
				s, ctx := setup(t)
				req := newRequest("user-1")
				req.TTL, req.Lease = tiny, tiny
				old := MustClaim(t, s, req)
				fin.finish(t, s, old.Fence())
				old = WaitFor(t, s, req, "expired", isExpired)

				next := req
				next.RequestHash = HashOf("a new request under the old key")
				next.TTL, next.Lease = longTTL, longLease
				res, err := s.Takeover(ctx, old.Fence(), next)
				if err != nil {
					t.Fatalf("Takeover: %v", err)
				}
				if !res.Won {
					t.Fatalf("Takeover of an expired %s row: Won = false, want true", old.Status)
				}
				rec := res.Record
				if rec.ID != old.ID {
					t.Errorf("Takeover changed the row id from %d to %d", old.ID, rec.ID)
				}
				checkFresh(t, rec, next, old.Attempt+1)
				if !rec.CreatedAt.After(old.CreatedAt) {
					t.Errorf("Takeover: CreatedAt %v, want after the old row's %v", rec.CreatedAt, old.CreatedAt)
				}
				sameRecord(t, "row after the takeover", Read(t, s, req), rec)

				wantNotOwner(t, "Complete by the old owner", s.Complete(ctx, old.Fence(), rawResponse([]byte("old"))))
				sameRecord(t, "row after the old owner's Complete", Read(t, s, req), rec)
				if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
					t.Fatalf("Complete by the new owner: %v", err)
				}
			})
		}

		t.Run("NotWhileUnexpired", func(t *testing.T) { takeoverNotWhileUnexpired(t, setup) })

		t.Run("NotWhileInFlightLeaseRuns", func(t *testing.T) { takeoverNotWhileInFlightLeaseRuns(t, setup) })

		takeover.runShared(t, setup)

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) { takeoverOneWinnerAmongManyGoroutines(t, setup) })
	})

	t.Run("Reclaim", func(t *testing.T) {
		t.Parallel()

		t.Run("InFlightLeaseOverIsReclaimed", func(t *testing.T) { reclaimInFlightLeaseOverIsReclaimed(t, setup) })

		t.Run("ExpiryNeverMovesEarlier", func(t *testing.T) { reclaimExpiryNeverMovesEarlier(t, setup) })

		t.Run("NotUnlessClaimedReclaimable", func(t *testing.T) { reclaimNotUnlessClaimedReclaimable(t, setup) })

		t.Run("NotWhileLeaseRuns", func(t *testing.T) { reclaimNotWhileLeaseRuns(t, setup) })

		finishes := []struct {
			name   string
			finish func(ctx context.Context, s idempotency.Store, f idempotency.Fence) error
		}{
			{"Completed", func(ctx context.Context, s idempotency.Store, f idempotency.Fence) error {
				return s.Complete(ctx, f, jsonResponse())
			}},
			{"Failed", func(ctx context.Context, s idempotency.Store, f idempotency.Fence) error {
				return s.Fail(ctx, f)
			}},
		}
		for _, fin := range finishes {
			t.Run("Not"+fin.name, func(t *testing.T) {
				s, ctx := setup(t)
				req := newRequest("user-1")
				req.Lease, req.Reclaimable = tiny, true
				MustClaim(t, s, req)
				// The owner finishes after its lease ran out: the fence
				// is the attempt, not the lease.
				rec := WaitFor(t, s, req, "lease over", isLeaseOver)
				if err := fin.finish(ctx, s, rec.Fence()); err != nil {
					t.Fatalf("finishing after the lease ran out: %v", err)
				}
				rec = Read(t, s, req)
				reclaim.lost(t, s, rec.Fence(), req, "of a "+string(rec.Status)+" row")
				sameRecord(t, "row after the refused reclaim", Read(t, s, req), rec)
			})
		}

		reclaim.runShared(t, setup)

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) { reclaimOneWinnerAmongManyGoroutines(t, setup) })
	})

	t.Run("Flags", func(t *testing.T) {
		t.Parallel()

		t.Run("LeaseOverWithoutExpiry", func(t *testing.T) { flagsLeaseOverWithoutExpiry(t, setup) })

		t.Run("ExpiryWithoutLeaseOver", func(t *testing.T) { flagsExpiryWithoutLeaseOver(t, setup) })
	})
}

// reuse is one of the two ways to claim a row that is not the caller's:
// Takeover of an expired row, Reclaim of a stale in-flight one.
type reuse struct {
	name  string // the Store method
	ready string // what the row must be first: "expired" or "lease over"
	cond  func(idempotency.Record) bool
	// stale makes req's row ready as soon as tiny runs out.
	stale func(req *idempotency.ClaimRequest)
	call  func(s idempotency.Store, ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error)
}

var (
	takeover = reuse{
		name: "Takeover", ready: "expired", cond: isExpired,
		stale: func(req *idempotency.ClaimRequest) { req.TTL, req.Lease = tiny, tiny },
		call:  idempotency.Store.Takeover,
	}
	reclaim = reuse{
		name: "Reclaim", ready: "lease over", cond: isLeaseOver,
		stale: func(req *idempotency.ClaimRequest) { req.Lease, req.Reclaimable = tiny, true },
		call:  idempotency.Store.Reclaim,
	}
)

// runShared runs the subtests Takeover and Reclaim share.
func (op reuse) runShared(t *testing.T, setup setupFunc) {
	t.Run("StaleAttemptLoses", func(t *testing.T) { op.staleAttemptLoses(t, setup) })
	t.Run("GoneRowLoses", func(t *testing.T) { op.goneRowLoses(t, setup) })
}

// staleAttemptLoses: only the fence of the row's current attempt wins; an
// earlier attempt's fence, or another row's id, loses and changes nothing.
func (op reuse) staleAttemptLoses(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	op.stale(&req)
	MustClaim(t, s, req)
	first := WaitFor(t, s, req, op.ready, op.cond)
	res, err := op.call(s, ctx, first.Fence(), req)
	if err != nil || !res.Won {
		t.Fatalf("first %s: won %v, err %v; want a win", op.name, res.Won, err)
	}
	second := WaitFor(t, s, req, op.ready, op.cond)
	if second.Attempt != 2 {
		t.Fatalf("attempt after one %s = %d, want 2", op.name, second.Attempt)
	}

	op.lost(t, s, first.Fence(), req, "with a stale attempt")
	op.lost(t, s, idempotency.Fence{ID: second.ID + 1<<20, Attempt: second.Attempt}, req, "of another id")
	sameRecord(t, "row after the refused calls", Read(t, s, req), second)

	res, err = op.call(s, ctx, second.Fence(), req)
	if err != nil || !res.Won {
		t.Fatalf("%s with the current attempt: won %v, err %v; want a win", op.name, res.Won, err)
	}
	if res.Record.Attempt != 3 {
		t.Fatalf("attempt after two calls of %s = %d, want 3", op.name, res.Record.Attempt)
	}
}

// goneRowLoses: a fence whose row was released loses, and creates no row.
func (op reuse) goneRowLoses(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	op.stale(&req)
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, op.ready, op.cond)
	if err := s.Release(ctx, rec.Fence()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	op.lost(t, s, rec.Fence(), req, "of a released row")
	recs, err := s.ExportScope(ctx, req.Scope)
	if err != nil || len(recs) != 0 {
		t.Fatalf("ExportScope after a refused %s of a released row: %d records, err %v; want none", op.name, len(recs), err)
	}
}

// lost checks that the call on f loses without an error.
func (op reuse) lost(t testing.TB, s idempotency.Store, f idempotency.Fence, req idempotency.ClaimRequest, what string) {
	t.Helper()
	res, err := op.call(s, t.Context(), f, req)
	if err != nil {
		t.Fatalf("%s %s: %v", op.name, what, err)
	}
	if res.Won || !reflect.DeepEqual(res.Record, idempotency.Record{}) {
		t.Fatalf("%s %s: won %v with record %+v, want a loss and the zero Record", op.name, what, res.Won, res.Record)
	}
}

// race runs racers calls on f at once, each with the request next(i)
// returns, checks that exactly one won, and returns its index and record.
func (op reuse) race(t *testing.T, s idempotency.Store, f idempotency.Fence,
	next func(i int) idempotency.ClaimRequest) (int, idempotency.Record) {
	t.Helper()
	results := make([]idempotency.ClaimResult, racers)
	race(racers, func(i int) {
		res, err := op.call(s, t.Context(), f, next(i))
		if err != nil {
			t.Errorf("%s %d: %v", op.name, i, err)
		}
		results[i] = res
	})
	winner := onlyWinner(t, results)
	return winner, results[winner].Record
}

// takeoverNotWhileUnexpired is the subtest Takeover/NotWhileUnexpired.
func takeoverNotWhileUnexpired(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	req.Lease = tiny
	rec := MustClaim(t, s, req)
	if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec = Read(t, s, req)
	next := req
	next.RequestHash = HashOf("other")
	takeover.lost(t, s, rec.Fence(), next, "of an unexpired row")
	sameRecord(t, "row after the refused takeover", Read(t, s, req), rec)
}

// takeoverNotWhileInFlightLeaseRuns is the subtest Takeover/NotWhileInFlightLeaseRuns.
func takeoverNotWhileInFlightLeaseRuns(t *testing.T, setup setupFunc) {
	// Instances that disagree on TTL and lease can leave an expired
	// row whose owner's lease still runs: its owner keeps it.
	s, _ := setup(t)
	req := newRequest("user-1")
	req.TTL = tiny
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "expired", isExpired)
	if rec.LeaseOver {
		t.Fatal("lease over too early: the test needs a long lease")
	}
	next := req
	next.RequestHash = HashOf("other")
	takeover.lost(t, s, rec.Fence(), next, "of an in-flight row inside its lease")
	sameRecord(t, "row after the refused takeover", Read(t, s, req), rec)
}

// takeoverOneWinnerAmongManyGoroutines is the subtest Takeover/OneWinnerAmongManyGoroutines.
func takeoverOneWinnerAmongManyGoroutines(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	req.TTL, req.Lease = tiny, tiny
	rec := MustClaim(t, s, req)
	if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec = WaitFor(t, s, req, "expired", isExpired)

	hashes := make([]string, racers)
	winner, won := takeover.race(t, s, rec.Fence(), func(i int) idempotency.ClaimRequest {
		next := req
		next.TTL = longTTL
		next.RequestHash = HashOf(req.Key, fmt.Sprint(i))
		hashes[i] = next.RequestHash
		return next
	})
	if won.Attempt != 2 || won.RequestHash != hashes[winner] {
		t.Errorf("winner's record: attempt %d hash %q, want 2 and %q", won.Attempt, won.RequestHash, hashes[winner])
	}
	sameRecord(t, "row after the race", Read(t, s, req), won)
}

// reclaimInFlightLeaseOverIsReclaimed is the subtest Reclaim/InFlightLeaseOverIsReclaimed.
func reclaimInFlightLeaseOverIsReclaimed(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	req.Lease, req.Reclaimable = tiny, true
	MustClaim(t, s, req)
	old := WaitFor(t, s, req, "lease over", isLeaseOver)
	if old.Expired {
		t.Fatalf("row with a TTL of %v is Expired", req.TTL)
	}

	again := req
	again.Lease = longLease
	again.TTL = req.TTL + time.Hour // later than the row's expiry: it moves
	res, err := s.Reclaim(ctx, old.Fence(), again)
	if err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	if !res.Won {
		t.Fatalf("Reclaim of an in_flight row whose lease is over: Won = false, want true")
	}
	rec := res.Record
	// Only the attempt, the lease and the expiry change.
	want := old
	want.Attempt = old.Attempt + 1
	want.LockedAt, want.LockedUntil, want.ExpiresAt = rec.LockedAt, rec.LockedUntil, rec.ExpiresAt
	sameRecord(t, "reclaimed record", rec, want)
	if !rec.LockedAt.After(old.LockedAt) {
		t.Errorf("Reclaim: LockedAt %v, want after the old %v", rec.LockedAt, old.LockedAt)
	}
	checkDuration(t, "LockedUntil - LockedAt", rec.LockedUntil.Sub(rec.LockedAt), again.Lease)
	checkDuration(t, "ExpiresAt - LockedAt", rec.ExpiresAt.Sub(rec.LockedAt), again.TTL)
	if rec.LeaseOver || rec.Expired {
		t.Errorf("reclaimed record: LeaseOver %v Expired %v, want both false", rec.LeaseOver, rec.Expired)
	}
	sameRecord(t, "row after the reclaim", Read(t, s, req), rec)

	wantNotOwner(t, "Complete by the stale owner", s.Complete(ctx, old.Fence(), jsonResponse()))
	wantNotOwner(t, "Release by the stale owner", s.Release(ctx, old.Fence()))
	sameRecord(t, "row after the stale owner's calls", Read(t, s, req), rec)
	if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
		t.Fatalf("Complete by the reclaimer: %v", err)
	}
}

// reclaimExpiryNeverMovesEarlier is the subtest Reclaim/ExpiryNeverMovesEarlier.
func reclaimExpiryNeverMovesEarlier(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	req.Lease, req.Reclaimable = tiny, true
	MustClaim(t, s, req)
	old := WaitFor(t, s, req, "lease over", isLeaseOver)
	again := req
	again.TTL = time.Minute // ends before the row's expiry
	res, err := s.Reclaim(ctx, old.Fence(), again)
	if err != nil || !res.Won {
		t.Fatalf("Reclaim: won %v, err %v; want a win", res.Won, err)
	}
	if !res.Record.ExpiresAt.Equal(old.ExpiresAt) {
		t.Errorf("Reclaim with a shorter TTL: ExpiresAt %v, want the row's %v kept", res.Record.ExpiresAt, old.ExpiresAt)
	}
}

// reclaimNotUnlessClaimedReclaimable is the subtest Reclaim/NotUnlessClaimedReclaimable.
func reclaimNotUnlessClaimedReclaimable(t *testing.T, setup setupFunc) {
	// A row claimed by a non-transactional route: its owner's
	// effects did not roll back, so it is never reclaimed.
	s, _ := setup(t)
	req := newRequest("user-1")
	req.Lease = tiny
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "lease over", func(r idempotency.Record) bool { return r.LeaseOver })
	if rec.Reclaimable {
		t.Fatal("a row claimed without Reclaimable reads back reclaimable")
	}
	res, err := s.Reclaim(context.Background(), rec.Fence(), req)
	if err != nil || res.Won {
		t.Fatalf("Reclaim of a non-reclaimable row: won %v, err %v; want a loss", res.Won, err)
	}
	sameRecord(t, "row after the refused reclaim", Read(t, s, req), rec)
}

// reclaimNotWhileLeaseRuns is the subtest Reclaim/NotWhileLeaseRuns.
func reclaimNotWhileLeaseRuns(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	reclaim.lost(t, s, rec.Fence(), req, "while the lease runs")
	sameRecord(t, "row after the refused reclaim", Read(t, s, req), rec)
}

// reclaimOneWinnerAmongManyGoroutines is the subtest Reclaim/OneWinnerAmongManyGoroutines.
func reclaimOneWinnerAmongManyGoroutines(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	req := newRequest("user-1")
	req.Lease, req.Reclaimable = tiny, true
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "lease over", isLeaseOver)

	_, won := reclaim.race(t, s, rec.Fence(), func(int) idempotency.ClaimRequest {
		again := req
		again.Lease = longLease
		return again
	})
	if won.Attempt != 2 || won.Status != idempotency.StatusInFlight {
		t.Errorf("winner's record: attempt %d status %q, want 2 in_flight", won.Attempt, won.Status)
	}
	sameRecord(t, "row after the race", Read(t, s, req), won)
}

// flagsLeaseOverWithoutExpiry is the subtest Flags/LeaseOverWithoutExpiry.
func flagsLeaseOverWithoutExpiry(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	req := newRequest("user-1")
	req.Lease = tiny
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "lease over", isLeaseOver)
	if rec.Expired {
		t.Errorf("row with TTL %v and lease %v: Expired = true, want false", req.TTL, req.Lease)
	}
}

// flagsExpiryWithoutLeaseOver is the subtest Flags/ExpiryWithoutLeaseOver.
func flagsExpiryWithoutLeaseOver(t *testing.T, setup setupFunc) {
	s, _ := setup(t)
	req := newRequest("user-1")
	req.TTL = tiny
	MustClaim(t, s, req)
	rec := WaitFor(t, s, req, "expired", isExpired)
	if rec.LeaseOver {
		t.Errorf("row with TTL %v and lease %v: LeaseOver = true, want false", req.TTL, req.Lease)
	}
}
