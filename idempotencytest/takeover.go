package idempotencytest

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/idemkit/idempotency"
)

// runTakeover checks how a row that is not the caller's is claimed again:
// Takeover of an expired row, and the
// Expired and LeaseOver flags they depend on.
func runTakeover(t *testing.T, setup setupFunc) {
	t.Run("Takeover", func(t *testing.T) {
		t.Parallel()

		finishes := []struct {
			name   string
			finish func(t *testing.T, s idempotency.Store, rec idempotency.Record)
		}{
			{"Completed", func(t *testing.T, s idempotency.Store, rec idempotency.Record) {
				if err := s.Complete(t.Context(), rec.Fence(), rec, jsonResponse()); err != nil {
					t.Fatalf("Complete: %v", err)
				}
			}},
			{"Failed", func(t *testing.T, s idempotency.Store, rec idempotency.Record) {
				if err := s.Fail(t.Context(), rec.Fence()); err != nil {
					t.Fatalf("Fail: %v", err)
				}
			}},
			{"InFlight", func(*testing.T, idempotency.Store, idempotency.Record) {}},
		}
		for _, fin := range finishes {
			t.Run("Expired"+fin.name+"RowIsTakenOver", func(t *testing.T) {
				s, ctx := setup(t)
				req := newRequest("user-1")
				req.TTL, req.Lease = tiny, tiny
				old := MustClaim(t, s, req)
				fin.finish(t, s, old)
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

				wantNotOwner(t, "Complete by the old owner", s.Complete(ctx, old.Fence(), old, rawResponse([]byte("old"))))
				sameRecord(t, "row after the old owner's Complete", Read(t, s, req), rec)
				if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
					t.Fatalf("Complete by the new owner: %v", err)
				}
			})
		}

		t.Run("KeepsDeriveKeyID", func(t *testing.T) { takeoverKeepsDeriveKeyID(t, setup) })

		t.Run("NotWhileUnexpired", func(t *testing.T) { takeoverNotWhileUnexpired(t, setup) })

		t.Run("NotWhileInFlightLeaseRuns", func(t *testing.T) { takeoverNotWhileInFlightLeaseRuns(t, setup) })

		takeover.runShared(t, setup)

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) { takeoverOneWinnerAmongManyGoroutines(t, setup) })
	})

	t.Run("Flags", func(t *testing.T) {
		t.Parallel()

		t.Run("LeaseOverWithoutExpiry", func(t *testing.T) { flagsLeaseOverWithoutExpiry(t, setup) })

		t.Run("ExpiryWithoutLeaseOver", func(t *testing.T) { flagsExpiryWithoutLeaseOver(t, setup) })
	})
}

// reuse is one of the two ways to claim a row that is not the caller's:
// Takeover of an expired row.
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
)

// runShared runs the shared subtests of a way to claim another's row.
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
	if res.Won || !res.Lost || !reflect.DeepEqual(res.Record, idempotency.Record{}) {
		t.Fatalf("%s %s: won %v, lost %v with record %+v; want Lost and the zero Record", op.name, what, res.Won, res.Lost, res.Record)
	}
}

// race runs racers calls on f at once, each with the request next(i)
// returns, checks that exactly one won and every other call says Lost, and
// returns the winner's index and record.
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
	for i, res := range results {
		if i != winner && !res.Lost {
			t.Errorf("%s %d lost the race without saying so: %+v", op.name, i, res)
		}
	}
	return winner, results[winner].Record
}

// takeoverNotWhileUnexpired is the subtest Takeover/NotWhileUnexpired.
func takeoverNotWhileUnexpired(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	req.Lease = tiny
	rec := MustClaim(t, s, req)
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
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
	if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
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

// takeoverKeepsDeriveKeyID: a claim stores its derive key id and every
// read returns it; a takeover keeps the row's (a re-execution derives the
// ids the first run sent, whatever key is active now), and sets the new
// claim's only on a row that named none.
func takeoverKeepsDeriveKeyID(t *testing.T, setup setupFunc) {
	for _, first := range []string{"key-a", ""} {
		t.Run(fmt.Sprintf("First=%q", first), func(t *testing.T) { takeoverKeepsDeriveKeyIDOf(t, setup, first) })
	}
}

// takeoverKeepsDeriveKeyIDOf is takeoverKeepsDeriveKeyID for a row first
// claimed under the derive key id first.
func takeoverKeepsDeriveKeyIDOf(t *testing.T, setup setupFunc, first string) {
	{
		s, ctx := setup(t)
		req := newRequest("user-1")
		req.TTL, req.Lease, req.DeriveKeyID = tiny, tiny, first
		old := MustClaim(t, s, req)
		if old.DeriveKeyID != first {
			t.Errorf("claim stored derive key id %q: the claim returned %q", first, old.DeriveKeyID)
		}
		if got := Read(t, s, req).DeriveKeyID; got != first {
			t.Errorf("claim stored derive key id %q: a read returned %q", first, got)
		}
		old = WaitFor(t, s, req, "expired", isExpired)
		next := req
		next.TTL, next.Lease, next.DeriveKeyID = longTTL, longLease, "key-b"
		res, err := s.Takeover(ctx, old.Fence(), next)
		if err != nil || !res.Won {
			t.Fatalf("Takeover: won %v, %v", res.Won, err)
		}
		want := first
		if want == "" {
			want = "key-b"
		}
		if res.Record.DeriveKeyID != want {
			t.Errorf("takeover of a row claimed under %q: DeriveKeyID %q, want %q", first, res.Record.DeriveKeyID, want)
		}
		sameRecord(t, "row after the takeover", Read(t, s, req), res.Record)
	}
}
