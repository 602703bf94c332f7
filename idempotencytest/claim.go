package idempotencytest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
)

// runClaim checks Claim: one winner per key, the existing row unchanged for
// everyone else, and that a done context changes nothing.
func runClaim(t *testing.T, setup setupFunc) {
	t.Run("Claim", func(t *testing.T) {
		t.Parallel()

		t.Run("NewKeyWins", func(t *testing.T) { claimNewKeyWins(t, setup) })

		t.Run("SecondClaimReturnsExistingRowUnchanged", func(t *testing.T) { claimSecondClaimReturnsExistingRowUnchanged(t, setup) })

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) { claimOneWinnerAmongManyGoroutines(t, setup) })

		t.Run("ScopeAndEndpointAreDistinct", func(t *testing.T) { claimScopeAndEndpointAreDistinct(t, setup) })

		t.Run("ManyKeysConcurrently", func(t *testing.T) { claimManyKeysConcurrently(t, setup) })
	})

	t.Run("DoneContext", func(t *testing.T) {
		t.Parallel()

		contexts := []struct {
			name string
			ctx  func(parent context.Context) (context.Context, context.CancelFunc)
		}{
			{"Cancelled", func(parent context.Context) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(parent)
				cancel()
				return ctx, cancel
			}},
			{"DeadlinePassed", func(parent context.Context) (context.Context, context.CancelFunc) {
				return context.WithDeadline(parent, time.Now().Add(-time.Second))
			}},
		}
		for _, c := range contexts {
			t.Run(c.name, func(t *testing.T) {
				s, ctx := setup(t)
				// A row every call would change if it ignored ctx: expired,
				// lease over, still in flight.
				req := newRequest("user-1")
				req.TTL, req.Lease = tiny, tiny
				MustClaim(t, s, req)
				rec := WaitFor(t, s, req, "expired, lease over", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
				fresh := newRequest("user-1")

				done, cancel := c.ctx(ctx)
				defer cancel()
				calls := map[string]func() error{
					"Claim": func() error { _, err := s.Claim(done, fresh); return err },
					"Takeover": func() error {
						_, err := s.Takeover(done, rec.Fence(), fresh)
						return err
					},
					"Complete":    func() error { return s.Complete(done, rec.Fence(), rec, jsonResponse()) },
					"Fail":        func() error { return s.Fail(done, rec.Fence()) },
					"Release":     func() error { return s.Release(done, rec.Fence()) },
					"Cleanup":     func() error { _, err := s.Cleanup(done, 100); return err },
					"Erase":       func() error { _, err := s.Erase(done, req.Scope); return err },
					"ExportScope": func() error { _, err := s.ExportScope(done, req.Scope); return err },
					"ReleaseOwner": func() error {
						owned := req
						owned.Owner = uuid.New()
						_, err := s.ReleaseOwner(done, owned)
						return err
					},
				}
				for name, call := range calls {
					err := call()
					var se *idempotency.StoreError
					switch {
					case err == nil:
						t.Errorf("%s with a done context: no error", name)
					case !errors.Is(err, idempotency.ErrStoreUnavailable):
						t.Errorf("%s with a done context: %v, want an error matching ErrStoreUnavailable", name, err)
					case !errors.As(err, &se):
						t.Errorf("%s with a done context: %T %v, want a *StoreError", name, err, err)
					case errors.Is(err, idempotency.ErrNotOwner):
						t.Errorf("%s with a done context: %v matches ErrNotOwner", name, err)
					}
				}

				// Nothing changed.
				sameRecord(t, "row after calls with a done context", Read(t, s, req), rec)
				checkFresh(t, MustClaim(t, s, fresh), fresh, 1)
			})
		}
	})
}

// claimNewKeyWins is the subtest Claim/NewKeyWins.
func claimNewKeyWins(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if !res.Won {
		t.Fatalf("Claim of a new key: Won = false, want true; record %+v", res.Record)
	}
	checkFresh(t, res.Record, req, 1)
	sameRecord(t, "row after the claim", Read(t, s, req), res.Record)
}

// claimSecondClaimReturnsExistingRowUnchanged is the subtest Claim/SecondClaimReturnsExistingRowUnchanged.
func claimSecondClaimReturnsExistingRowUnchanged(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	first := MustClaim(t, s, req)

	again := req
	again.RequestHash = HashOf("another body")
	again.TTL = 2 * longTTL
	again.Lease = 2 * longLease
	res, err := s.Claim(ctx, again)
	if err != nil {
		t.Fatalf("second Claim: %v", err)
	}
	if res.Won {
		t.Fatalf("second Claim of one key: Won = true, want false")
	}
	sameRecord(t, "second claim's record", res.Record, first)
	if res.Record.Status != idempotency.StatusInFlight || res.Record.Attempt != 1 || res.Record.RequestHash != req.RequestHash {
		t.Errorf("second claim's record: status %q attempt %d hash %q, want in_flight, 1, the first claim's hash",
			res.Record.Status, res.Record.Attempt, res.Record.RequestHash)
	}
	if res.Record.Expired || res.Record.LeaseOver {
		t.Errorf("second claim's record: Expired %v LeaseOver %v, want both false", res.Record.Expired, res.Record.LeaseOver)
	}
	// The losing claim must not have modified the row either.
	sameRecord(t, "row after the second claim", Read(t, s, req), first)
}

// claimOneWinnerAmongManyGoroutines is the subtest Claim/OneWinnerAmongManyGoroutines.
func claimOneWinnerAmongManyGoroutines(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	base := newRequest("user-1")
	results := make([]idempotency.ClaimResult, racers)
	hashes := make([]string, racers)
	race(racers, func(i int) {
		req := base
		req.RequestHash = HashOf(base.Key, fmt.Sprint(i))
		hashes[i] = req.RequestHash
		res, err := s.Claim(ctx, req)
		if err != nil {
			t.Errorf("Claim %d: %v", i, err)
		}
		results[i] = res
	})
	winner := -1
	for i, res := range results {
		if !res.Won {
			continue
		}
		if winner >= 0 {
			t.Fatalf("claims %d and %d both won one key", winner, i)
		}
		winner = i
	}
	if winner < 0 {
		t.Fatalf("no claim of %d won a new key", racers)
	}
	won := results[winner].Record
	if won.RequestHash != hashes[winner] {
		t.Errorf("winner's record has hash %q, want its own %q", won.RequestHash, hashes[winner])
	}
	for i, res := range results {
		if i != winner {
			sameRecord(t, fmt.Sprintf("loser %d's record", i), res.Record, won)
		}
	}
	sameRecord(t, "row after the race", Read(t, s, base), won)
}

// claimScopeAndEndpointAreDistinct is the subtest Claim/ScopeAndEndpointAreDistinct.
func claimScopeAndEndpointAreDistinct(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	key := NewKey()
	reqs := []idempotency.ClaimRequest{
		{Key: key, Scope: "user-a", Endpoint: endpoint},
		{Key: key, Scope: "user-b", Endpoint: endpoint},
		{Key: key, Scope: "", Endpoint: endpoint},
		{Key: key, Scope: "user-a", Endpoint: otherEndpoint},
		{Key: key, Scope: "", Endpoint: otherEndpoint},
	}
	recs := make([]idempotency.Record, len(reqs))
	ids := map[int64]int{}
	for i := range reqs {
		reqs[i].RequestHash = HashOf(key, fmt.Sprint(i))
		reqs[i].TTL, reqs[i].Lease = longTTL, longLease
		recs[i] = MustClaim(t, s, reqs[i])
		if j, dup := ids[recs[i].ID]; dup {
			t.Fatalf("claims %d and %d (distinct scope or endpoint) share row %d", j, i, recs[i].ID)
		}
		ids[recs[i].ID] = i
	}

	// Finishing one of them leaves the others alone.
	if err := s.Complete(ctx, recs[0].Fence(), recs[0], jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := recs[0]
	want.Status = idempotency.StatusCompleted
	want.Response = jsonResponse()
	sameRecord(t, "completed row", Read(t, s, reqs[0]), want)
	for i := 1; i < len(reqs); i++ {
		sameRecord(t, fmt.Sprintf("row %d (scope %q, endpoint %q)", i, reqs[i].Scope, reqs[i].Endpoint), Read(t, s, reqs[i]), recs[i])
	}
}

// claimManyKeysConcurrently is the subtest Claim/ManyKeysConcurrently.
func claimManyKeysConcurrently(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	const workers, perWorker = 8, 10
	race(workers, func(w int) {
		for range perWorker {
			req := newRequest(fmt.Sprint("user-", w))
			res, err := s.Claim(ctx, req)
			if err != nil || !res.Won {
				t.Errorf("Claim of a new key: won %v, err %v", res.Won, err)
				return
			}
			resp := rawResponse([]byte(req.Key))
			if err := s.Complete(ctx, res.Record.Fence(), res.Record, resp); err != nil {
				t.Errorf("Complete: %v", err)
				return
			}
			got, err := s.Claim(ctx, req)
			if err != nil || got.Won || got.Record.Status != idempotency.StatusCompleted {
				t.Errorf("Claim after Complete: won %v, status %q, err %v", got.Won, got.Record.Status, err)
				return
			}
			if d := diffResponse(got.Record.Response, resp); d != "" {
				t.Errorf("response of key %s: %s", req.Key, d)
			}
		}
	})
}
