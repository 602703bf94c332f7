// Package storetest is the behaviour suite every idempotency.Store must
// pass: the memory store and the Postgres store run the same tests, so they
// keep the same semantics.
//
// The suite never assumes the store's clock is the caller's: a key given a
// tiny TTL or lease is polled with Claim until the store itself reports it
// expired or its lease over. It asserts behaviour, never speed.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

const (
	endpoint      = "POST /api/trading/orders"
	otherEndpoint = "POST /api/billing/checkout-sessions"

	longTTL   = time.Hour        // a row that does not expire during a test
	longLease = 30 * time.Second // a lease that does not run out during a test
	tiny      = time.Millisecond // a TTL or lease that runs out almost at once

	// waitBound bounds every poll for expiry or a lease to run out. It is
	// generous on purpose: it only turns a hang into a failure.
	waitBound = 10 * time.Second
	// tolerance is how far a stored duration (expires_at - created_at,
	// locked_until - locked_at) may be from the requested one. A store
	// that computes both ends from one now() is exact.
	tolerance = 100 * time.Millisecond

	racers = 64 // goroutines racing for one key
)

// Run runs the suite against the stores newStore returns. Every subtest
// runs in parallel and calls newStore once, so newStore must return an
// empty store that shares no rows with any other store it returns (for
// Postgres, its own schema or database), and release it with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	setup := func(t *testing.T) (idempotency.Store, context.Context) {
		t.Helper()
		t.Parallel()
		return newStore(t), t.Context()
	}

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()

		t.Run("NewKeyWins", func(t *testing.T) {
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
			sameRecord(t, "row after the claim", read(t, s, req), res.Record)
		})

		t.Run("SecondClaimReturnsExistingRowUnchanged", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			first := mustClaim(t, s, req)

			again := req
			again.RequestHash = hashOf("another body")
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
			sameRecord(t, "row after the second claim", read(t, s, req), first)
		})

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) {
			s, ctx := setup(t)
			base := newRequest("user-1")
			results := make([]idempotency.ClaimResult, racers)
			hashes := make([]string, racers)
			race(racers, func(i int) {
				req := base
				req.RequestHash = hashOf(base.Key, fmt.Sprint(i))
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
			sameRecord(t, "row after the race", read(t, s, base), won)
		})

		t.Run("ScopeAndEndpointAreDistinct", func(t *testing.T) {
			s, ctx := setup(t)
			key := newKey()
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
				reqs[i].RequestHash = hashOf(key, fmt.Sprint(i))
				reqs[i].TTL, reqs[i].Lease = longTTL, longLease
				recs[i] = mustClaim(t, s, reqs[i])
				if j, dup := ids[recs[i].ID]; dup {
					t.Fatalf("claims %d and %d (distinct scope or endpoint) share row %d", j, i, recs[i].ID)
				}
				ids[recs[i].ID] = i
			}

			// Finishing one of them leaves the others alone.
			if err := s.Complete(ctx, recs[0].Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			want := recs[0]
			want.Status = idempotency.StatusCompleted
			want.Response = jsonResponse()
			sameRecord(t, "completed row", read(t, s, reqs[0]), want)
			for i := 1; i < len(reqs); i++ {
				sameRecord(t, fmt.Sprintf("row %d (scope %q, endpoint %q)", i, reqs[i].Scope, reqs[i].Endpoint), read(t, s, reqs[i]), recs[i])
			}
		})

		t.Run("ManyKeysConcurrently", func(t *testing.T) {
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
					if err := s.Complete(ctx, res.Record.Fence(), resp); err != nil {
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
		})
	})

	t.Run("Complete", func(t *testing.T) {
		t.Parallel()

		binary := make([]byte, 0, 260)
		for b := range 256 {
			binary = append(binary, byte(b))
		}
		binary = append(binary, 0xff, 0xfe, 0x00, 0xc3) // invalid UTF-8, ends mid-rune

		cases := []struct {
			name string
			resp idempotency.Response
		}{
			{"JSONObjectWithHeaders", jsonResponse()},
			{"JSONArray", idempotency.Response{
				Status:   200,
				Header:   http.Header{"Content-Type": {"application/json"}},
				Body:     []byte(`[1, "two", {"three": 3.5}, null, true]`),
				BodyKind: idempotency.BodyJSON,
			}},
			{"JSONClientError", idempotency.Response{
				Status:   400,
				Header:   http.Header{"Content-Type": {"application/json; charset=utf-8"}},
				Body:     []byte(`{"error":"invalid_order","message":"qty must be positive"}`),
				BodyKind: idempotency.BodyJSON,
			}},
			{"RawText", idempotency.Response{
				Status:   202,
				Header:   http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "Content-Language": {"en", "de"}},
				Body:     []byte("accepted\n  with white space kept  \n"),
				BodyKind: idempotency.BodyRaw,
			}},
			{"RawEmpty", idempotency.Response{
				Status:   200,
				Body:     []byte{},
				BodyKind: idempotency.BodyRaw,
			}},
			{"RawBinary", idempotency.Response{
				Status:   201,
				Header:   http.Header{"Content-Type": {"application/octet-stream"}},
				Body:     binary,
				BodyKind: idempotency.BodyRaw,
			}},
			{"RawNotQuiteJSON", idempotency.Response{
				Status:   200,
				Header:   http.Header{"Content-Type": {"application/json"}},
				Body:     []byte(`{"a":1}  `),
				BodyKind: idempotency.BodyRaw,
			}},
			{"BodyNone", idempotency.Response{
				Status:   201,
				Header:   http.Header{"Location": {"/api/trading/orders/7"}},
				BodyKind: idempotency.BodyNone,
			}},
		}
		for _, tc := range cases {
			t.Run("Replays"+tc.name, func(t *testing.T) {
				s, ctx := setup(t)
				req := newRequest("user-1")
				rec := mustClaim(t, s, req)
				if err := s.Complete(ctx, rec.Fence(), tc.resp); err != nil {
					t.Fatalf("Complete: %v", err)
				}
				got := read(t, s, req)
				want := rec
				want.Status = idempotency.StatusCompleted
				want.Response = tc.resp
				// Completion leaves the row's times alone, the lease included.
				sameRecord(t, "completed row", got, want)
				if got.Expired || got.LeaseOver {
					t.Errorf("completed row: Expired %v LeaseOver %v, want both false", got.Expired, got.LeaseOver)
				}
			})
		}

		t.Run("StoresAndReturnsCopies", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			want := idempotency.Response{
				Status:   201,
				Header:   http.Header{"Content-Type": {"text/plain"}, "X-Multi": {"a", "b"}},
				Body:     []byte("hello"),
				BodyKind: idempotency.BodyRaw,
			}
			// The caller's buffers, reused after Complete returns.
			resp := idempotency.Response{Status: want.Status, Header: want.Header.Clone(), Body: bytes.Clone(want.Body), BodyKind: want.BodyKind}
			if err := s.Complete(ctx, rec.Fence(), resp); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			copy(resp.Body, "HELLO")
			resp.Header["X-Multi"][0] = "z"
			resp.Header.Set("Content-Type", "image/png")
			resp.Header.Set("X-Added", "1")

			got := read(t, s, req)
			if d := diffResponse(got.Response, want); d != "" {
				t.Fatalf("after the caller reused its buffers: %s", d)
			}
			// Records handed out are copies too.
			scribble(got.Response)
			if d := diffResponse(read(t, s, req).Response, want); d != "" {
				t.Fatalf("after a Claim's record was modified: %s", d)
			}
			recs, err := s.ExportScope(ctx, req.Scope)
			if err != nil || len(recs) != 1 {
				t.Fatalf("ExportScope: %d records, err %v; want 1", len(recs), err)
			}
			scribble(recs[0].Response)
			if d := diffResponse(read(t, s, req).Response, want); d != "" {
				t.Fatalf("after an exported record was modified: %s", d)
			}
		})

		t.Run("SecondCompleteIsNotOwner", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			first := jsonResponse()
			if err := s.Complete(ctx, rec.Fence(), first); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			want := rec
			want.Status = idempotency.StatusCompleted
			want.Response = first

			wantNotOwner(t, "second Complete", s.Complete(ctx, rec.Fence(), rawResponse([]byte("second"))))
			wantNotOwner(t, "Fail after Complete", s.Fail(ctx, rec.Fence()))
			wantNotOwner(t, "Release after Complete", s.Release(ctx, rec.Fence()))
			sameRecord(t, "completed row", read(t, s, req), want)
		})
	})

	t.Run("Fail", func(t *testing.T) {
		t.Parallel()

		t.Run("MarksFailed", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			if err := s.Fail(ctx, rec.Fence()); err != nil {
				t.Fatalf("Fail: %v", err)
			}
			want := rec
			want.Status = idempotency.StatusFailed
			sameRecord(t, "failed row", read(t, s, req), want)

			wantNotOwner(t, "Complete after Fail", s.Complete(ctx, rec.Fence(), jsonResponse()))
			wantNotOwner(t, "second Fail", s.Fail(ctx, rec.Fence()))
			wantNotOwner(t, "Release after Fail", s.Release(ctx, rec.Fence()))
			sameRecord(t, "failed row after the refused calls", read(t, s, req), want)
		})
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()

		t.Run("NewClaimWins", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			old := mustClaim(t, s, req)
			if err := s.Release(ctx, old.Fence()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			again := req
			again.RequestHash = hashOf("the retry's body")
			rec := mustClaim(t, s, again)
			checkFresh(t, rec, again, 1)
			// A reused id would let the old owner's fence match the new row.
			if rec.ID == old.ID {
				t.Fatalf("the claim after Release reused row id %d", rec.ID)
			}

			wantNotOwner(t, "Complete by the released owner", s.Complete(ctx, old.Fence(), jsonResponse()))
			wantNotOwner(t, "Fail by the released owner", s.Fail(ctx, old.Fence()))
			wantNotOwner(t, "Release by the released owner", s.Release(ctx, old.Fence()))
			sameRecord(t, "new row", read(t, s, again), rec)
		})
	})

	t.Run("Fence", func(t *testing.T) {
		t.Parallel()

		t.Run("WrongFenceIsNotOwner", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			f := rec.Fence()
			wrong := []idempotency.Fence{
				{ID: f.ID, Attempt: f.Attempt + 1},
				{ID: f.ID, Attempt: f.Attempt - 1},
				{ID: f.ID + 1<<20, Attempt: f.Attempt},
				{ID: f.ID, Attempt: f.Attempt},                  // no scope
				{ID: f.ID, Attempt: f.Attempt, Scope: "user-2"}, // another scope
				{},
			}
			for _, w := range wrong {
				wantNotOwner(t, fmt.Sprintf("Complete with fence %+v", w), s.Complete(ctx, w, jsonResponse()))
				wantNotOwner(t, fmt.Sprintf("Fail with fence %+v", w), s.Fail(ctx, w))
				wantNotOwner(t, fmt.Sprintf("Release with fence %+v", w), s.Release(ctx, w))
			}
			sameRecord(t, "row after the refused calls", read(t, s, req), rec)

			// The right fence still owns it.
			if err := s.Complete(ctx, f, jsonResponse()); err != nil {
				t.Fatalf("Complete with the owner's fence: %v", err)
			}
		})

		t.Run("GoneRowIsNotOwner", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			if err := s.Release(ctx, rec.Fence()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			wantNotOwner(t, "Complete of a released row", s.Complete(ctx, rec.Fence(), jsonResponse()))
			wantNotOwner(t, "Fail of a released row", s.Fail(ctx, rec.Fence()))
			wantNotOwner(t, "Release of a released row", s.Release(ctx, rec.Fence()))
			// None of them brought the row back.
			recs, err := s.ExportScope(ctx, req.Scope)
			if err != nil {
				t.Fatalf("ExportScope: %v", err)
			}
			if len(recs) != 0 {
				t.Fatalf("ExportScope after Release: %d records, want 0: %+v", len(recs), recs)
			}
			checkFresh(t, mustClaim(t, s, req), req, 1)
		})
	})

	t.Run("Owner", func(t *testing.T) {
		t.Parallel()
		ownerTests(t, setup)
	})

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
				old := mustClaim(t, s, req)
				fin.finish(t, s, old.Fence())
				old = waitFor(t, s, req, "expired", isExpired)

				next := req
				next.RequestHash = hashOf("a new request under the old key")
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
				sameRecord(t, "row after the takeover", read(t, s, req), rec)

				wantNotOwner(t, "Complete by the old owner", s.Complete(ctx, old.Fence(), rawResponse([]byte("old"))))
				sameRecord(t, "row after the old owner's Complete", read(t, s, req), rec)
				if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
					t.Fatalf("Complete by the new owner: %v", err)
				}
			})
		}

		t.Run("NotWhileUnexpired", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease = tiny
			rec := mustClaim(t, s, req)
			if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			rec = read(t, s, req)
			next := req
			next.RequestHash = hashOf("other")
			lostTakeover(t, s, rec.Fence(), next, "of an unexpired row")
			sameRecord(t, "row after the refused takeover", read(t, s, req), rec)
		})

		t.Run("NotWhileInFlightLeaseRuns", func(t *testing.T) {
			// Instances that disagree on TTL and lease can leave an expired
			// row whose owner's lease still runs: its owner keeps it.
			s, _ := setup(t)
			req := newRequest("user-1")
			req.TTL = tiny
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "expired", isExpired)
			if rec.LeaseOver {
				t.Fatal("lease over too early: the test needs a long lease")
			}
			next := req
			next.RequestHash = hashOf("other")
			lostTakeover(t, s, rec.Fence(), next, "of an in-flight row inside its lease")
			sameRecord(t, "row after the refused takeover", read(t, s, req), rec)
		})

		t.Run("StaleAttemptLoses", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.TTL, req.Lease = tiny, tiny
			first := mustClaim(t, s, req)
			waitFor(t, s, req, "expired", isExpired)

			res, err := s.Takeover(ctx, first.Fence(), req)
			if err != nil || !res.Won {
				t.Fatalf("first Takeover: won %v, err %v; want a win", res.Won, err)
			}
			second := waitFor(t, s, req, "expired", isExpired)
			if second.Attempt != 2 {
				t.Fatalf("attempt after one takeover = %d, want 2", second.Attempt)
			}

			lostTakeover(t, s, first.Fence(), req, "with a stale attempt")
			lostTakeover(t, s, idempotency.Fence{ID: second.ID + 1<<20, Attempt: second.Attempt}, req, "of another id")
			sameRecord(t, "row after the refused takeovers", read(t, s, req), second)

			res, err = s.Takeover(ctx, second.Fence(), req)
			if err != nil || !res.Won {
				t.Fatalf("Takeover with the current attempt: won %v, err %v; want a win", res.Won, err)
			}
			if res.Record.Attempt != 3 {
				t.Fatalf("attempt after two takeovers = %d, want 3", res.Record.Attempt)
			}
		})

		t.Run("GoneRowLoses", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.TTL, req.Lease = tiny, tiny
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "expired", isExpired)
			if err := s.Release(ctx, rec.Fence()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			lostTakeover(t, s, rec.Fence(), req, "of a released row")
			recs, err := s.ExportScope(ctx, req.Scope)
			if err != nil || len(recs) != 0 {
				t.Fatalf("ExportScope after a refused takeover of a released row: %d records, err %v; want none", len(recs), err)
			}
		})

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.TTL, req.Lease = tiny, tiny
			rec := mustClaim(t, s, req)
			if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			rec = waitFor(t, s, req, "expired", isExpired)

			results := make([]idempotency.ClaimResult, racers)
			hashes := make([]string, racers)
			race(racers, func(i int) {
				next := req
				next.TTL = longTTL
				next.RequestHash = hashOf(req.Key, fmt.Sprint(i))
				hashes[i] = next.RequestHash
				res, err := s.Takeover(ctx, rec.Fence(), next)
				if err != nil {
					t.Errorf("Takeover %d: %v", i, err)
				}
				results[i] = res
			})
			winner := onlyWinner(t, results)
			won := results[winner].Record
			if won.Attempt != 2 || won.RequestHash != hashes[winner] {
				t.Errorf("winner's record: attempt %d hash %q, want 2 and %q", won.Attempt, won.RequestHash, hashes[winner])
			}
			sameRecord(t, "row after the race", read(t, s, req), won)
		})
	})

	t.Run("Reclaim", func(t *testing.T) {
		t.Parallel()

		t.Run("InFlightLeaseOverIsReclaimed", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease, req.Reclaimable = tiny, true
			mustClaim(t, s, req)
			old := waitFor(t, s, req, "lease over", isLeaseOver)
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
			sameRecord(t, "row after the reclaim", read(t, s, req), rec)

			wantNotOwner(t, "Complete by the stale owner", s.Complete(ctx, old.Fence(), jsonResponse()))
			wantNotOwner(t, "Release by the stale owner", s.Release(ctx, old.Fence()))
			sameRecord(t, "row after the stale owner's calls", read(t, s, req), rec)
			if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete by the reclaimer: %v", err)
			}
		})

		t.Run("ExpiryNeverMovesEarlier", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease, req.Reclaimable = tiny, true
			mustClaim(t, s, req)
			old := waitFor(t, s, req, "lease over", isLeaseOver)
			again := req
			again.TTL = time.Minute // ends before the row's expiry
			res, err := s.Reclaim(ctx, old.Fence(), again)
			if err != nil || !res.Won {
				t.Fatalf("Reclaim: won %v, err %v; want a win", res.Won, err)
			}
			if !res.Record.ExpiresAt.Equal(old.ExpiresAt) {
				t.Errorf("Reclaim with a shorter TTL: ExpiresAt %v, want the row's %v kept", res.Record.ExpiresAt, old.ExpiresAt)
			}
		})

		t.Run("NotUnlessClaimedReclaimable", func(t *testing.T) {
			// A row claimed by a non-transactional route: its owner's
			// effects did not roll back, so it is never reclaimed.
			s, _ := setup(t)
			req := newRequest("user-1")
			req.Lease = tiny
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "lease over", func(r idempotency.Record) bool { return r.LeaseOver })
			if rec.Reclaimable {
				t.Fatal("a row claimed without Reclaimable reads back reclaimable")
			}
			res, err := s.Reclaim(context.Background(), rec.Fence(), req)
			if err != nil || res.Won {
				t.Fatalf("Reclaim of a non-reclaimable row: won %v, err %v; want a loss", res.Won, err)
			}
			sameRecord(t, "row after the refused reclaim", read(t, s, req), rec)
		})

		t.Run("NotWhileLeaseRuns", func(t *testing.T) {
			s, _ := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			lostReclaim(t, s, rec.Fence(), req, "while the lease runs")
			sameRecord(t, "row after the refused reclaim", read(t, s, req), rec)
		})

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
				mustClaim(t, s, req)
				// The owner finishes after its lease ran out: the fence
				// is the attempt, not the lease.
				rec := waitFor(t, s, req, "lease over", isLeaseOver)
				if err := fin.finish(ctx, s, rec.Fence()); err != nil {
					t.Fatalf("finishing after the lease ran out: %v", err)
				}
				rec = read(t, s, req)
				lostReclaim(t, s, rec.Fence(), req, "of a "+string(rec.Status)+" row")
				sameRecord(t, "row after the refused reclaim", read(t, s, req), rec)
			})
		}

		t.Run("StaleAttemptLoses", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease, req.Reclaimable = tiny, true
			mustClaim(t, s, req)
			first := waitFor(t, s, req, "lease over", isLeaseOver)
			res, err := s.Reclaim(ctx, first.Fence(), req)
			if err != nil || !res.Won {
				t.Fatalf("first Reclaim: won %v, err %v; want a win", res.Won, err)
			}
			second := waitFor(t, s, req, "lease over", isLeaseOver)

			lostReclaim(t, s, first.Fence(), req, "with a stale attempt")
			lostReclaim(t, s, idempotency.Fence{ID: second.ID + 1<<20, Attempt: second.Attempt}, req, "of another id")
			sameRecord(t, "row after the refused reclaims", read(t, s, req), second)

			res, err = s.Reclaim(ctx, second.Fence(), req)
			if err != nil || !res.Won {
				t.Fatalf("Reclaim with the current attempt: won %v, err %v; want a win", res.Won, err)
			}
			if res.Record.Attempt != 3 {
				t.Fatalf("attempt after two reclaims = %d, want 3", res.Record.Attempt)
			}
		})

		t.Run("GoneRowLoses", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease, req.Reclaimable = tiny, true
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "lease over", isLeaseOver)
			if err := s.Release(ctx, rec.Fence()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			lostReclaim(t, s, rec.Fence(), req, "of a released row")
		})

		t.Run("OneWinnerAmongManyGoroutines", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			req.Lease, req.Reclaimable = tiny, true
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "lease over", isLeaseOver)

			results := make([]idempotency.ClaimResult, racers)
			race(racers, func(i int) {
				again := req
				again.Lease = longLease
				res, err := s.Reclaim(ctx, rec.Fence(), again)
				if err != nil {
					t.Errorf("Reclaim %d: %v", i, err)
				}
				results[i] = res
			})
			winner := onlyWinner(t, results)
			won := results[winner].Record
			if won.Attempt != 2 || won.Status != idempotency.StatusInFlight {
				t.Errorf("winner's record: attempt %d status %q, want 2 in_flight", won.Attempt, won.Status)
			}
			sameRecord(t, "row after the race", read(t, s, req), won)
		})
	})

	t.Run("Flags", func(t *testing.T) {
		t.Parallel()

		t.Run("LeaseOverWithoutExpiry", func(t *testing.T) {
			s, _ := setup(t)
			req := newRequest("user-1")
			req.Lease = tiny
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "lease over", isLeaseOver)
			if rec.Expired {
				t.Errorf("row with TTL %v and lease %v: Expired = true, want false", req.TTL, req.Lease)
			}
		})

		t.Run("ExpiryWithoutLeaseOver", func(t *testing.T) {
			s, _ := setup(t)
			req := newRequest("user-1")
			req.TTL = tiny
			mustClaim(t, s, req)
			rec := waitFor(t, s, req, "expired", isExpired)
			if rec.LeaseOver {
				t.Errorf("row with TTL %v and lease %v: LeaseOver = true, want false", req.TTL, req.Lease)
			}
		})
	})

	t.Run("DeleteExpired", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletesOnlyExpiredRowsNoOneOwns", func(t *testing.T) {
			s, ctx := setup(t)
			const scope = "user-1"
			type row struct {
				req      idempotency.ClaimRequest
				rec      idempotency.Record
				finish   string // "complete", "fail" or "" (stays in flight)
				deletion bool   // cleanup must delete it
			}
			rows := map[string]*row{
				"expired completed":             {req: request(scope, tiny, longLease), finish: "complete", deletion: true},
				"expired failed":                {req: request(scope, tiny, longLease), finish: "fail", deletion: true},
				"expired in_flight, lease over": {req: request(scope, tiny, tiny), deletion: true},
				"expired in_flight, live lease": {req: request(scope, tiny, longTTL)},
				"live completed":                {req: request(scope, longTTL, longLease), finish: "complete"},
				"live in_flight, lease over":    {req: request(scope, longTTL, tiny)},
			}
			for name, r := range rows {
				r.rec = mustClaim(t, s, r.req)
				var err error
				switch r.finish {
				case "complete":
					err = s.Complete(ctx, r.rec.Fence(), jsonResponse())
				case "fail":
					err = s.Fail(ctx, r.rec.Fence())
				}
				if err != nil {
					t.Fatalf("finishing %s: %v", name, err)
				}
			}
			for name, r := range rows {
				wantExpired := r.req.TTL == tiny
				wantLeaseOver := r.req.Lease == tiny
				got := waitFor(t, s, r.req, name, func(rec idempotency.Record) bool {
					return (!wantExpired || rec.Expired) && (!wantLeaseOver || rec.LeaseOver)
				})
				if got.Expired != wantExpired || got.LeaseOver != wantLeaseOver {
					t.Fatalf("%s: Expired %v, LeaseOver %v; want %v, %v", name, got.Expired, got.LeaseOver, wantExpired, wantLeaseOver)
				}
			}

			n, err := s.DeleteExpired(ctx, 100)
			if err != nil {
				t.Fatalf("DeleteExpired: %v", err)
			}
			if n != 3 {
				t.Errorf("DeleteExpired = %d, want 3", n)
			}
			left := exportIDs(t, s, scope)
			for name, r := range rows {
				if _, ok := left[r.rec.ID]; ok == r.deletion {
					t.Errorf("after cleanup, %s is present = %v, want %v", name, ok, !r.deletion)
				}
			}
			if n, err := s.DeleteExpired(ctx, 100); err != nil || n != 0 {
				t.Errorf("second DeleteExpired = %d, %v; want 0, nil", n, err)
			}

			// The live owner still owns its key; the orphan's owner does not.
			if err := s.Complete(ctx, rows["expired in_flight, live lease"].rec.Fence(), jsonResponse()); err != nil {
				t.Errorf("Complete by the owner of a live lease after cleanup: %v", err)
			}
			wantNotOwner(t, "Complete of a cleaned-up orphan", s.Complete(ctx, rows["expired in_flight, lease over"].rec.Fence(), jsonResponse()))
			// A cleaned-up key is new again.
			checkFresh(t, mustClaim(t, s, rows["expired completed"].req), rows["expired completed"].req, 1)
		})

		t.Run("HonoursLimit", func(t *testing.T) {
			s, ctx := setup(t)
			const scope, expired = "user-1", 5
			for range expired {
				req := request(scope, tiny, longLease)
				rec := mustClaim(t, s, req)
				if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
					t.Fatalf("Complete: %v", err)
				}
				waitFor(t, s, req, "expired", isExpired)
			}
			live := mustClaim(t, s, request(scope, longTTL, longLease))

			// A limit of zero deletes nothing.
			if n, err := s.DeleteExpired(ctx, 0); err != nil || n != 0 {
				t.Errorf("DeleteExpired(0) = %d, %v; want 0, nil", n, err)
			}
			if left := exportIDs(t, s, scope); len(left) != expired+1 {
				t.Fatalf("after DeleteExpired(0), %d rows left, want %d", len(left), expired+1)
			}

			// Batches as cleanup runs them: until one deletes nothing.
			var total int64
			for i := 0; ; i++ {
				if i > expired {
					t.Fatalf("DeleteExpired still deleting after %d calls", i)
				}
				limit := 1 + i%2
				n, err := s.DeleteExpired(ctx, limit)
				if err != nil {
					t.Fatalf("DeleteExpired: %v", err)
				}
				if n < 0 || n > int64(limit) {
					t.Fatalf("DeleteExpired(%d) = %d", limit, n)
				}
				if n == 0 {
					break
				}
				total += n
			}
			if total != expired {
				t.Errorf("DeleteExpired deleted %d rows in all, want %d", total, expired)
			}
			left := exportIDs(t, s, scope)
			if _, ok := left[live.ID]; !ok || len(left) != 1 {
				t.Errorf("after cleanup, rows %v are left, want only the live row %d", left, live.ID)
			}
		})
	})

	t.Run("DeleteScope", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletesAllButLiveInFlightRows", func(t *testing.T) {
			s, ctx := setup(t)
			const scope = "user-42"
			completed := request(scope, longTTL, longLease)
			failed := request(scope, longTTL, longLease)
			expired := request(scope, tiny, longLease)
			stale := request(scope, longTTL, tiny)
			live := request(scope, longTTL, longLease)
			completedRec := mustClaim(t, s, completed)
			failedRec := mustClaim(t, s, failed)
			expiredRec := mustClaim(t, s, expired)
			staleRec := mustClaim(t, s, stale)
			liveRec := mustClaim(t, s, live)
			if err := s.Complete(ctx, completedRec.Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if err := s.Fail(ctx, failedRec.Fence()); err != nil {
				t.Fatalf("Fail: %v", err)
			}
			if err := s.Complete(ctx, expiredRec.Fence(), jsonResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			waitFor(t, s, expired, "expired", isExpired)
			waitFor(t, s, stale, "lease over", isLeaseOver)

			// The same key in other scopes, the unscoped one included.
			other := completed
			other.Scope = "user-43"
			otherRec := mustClaim(t, s, other)
			unscoped := completed
			unscoped.Scope = ""
			unscopedRec := mustClaim(t, s, unscoped)

			res, err := s.DeleteScope(ctx, scope)
			if err != nil {
				t.Fatalf("DeleteScope: %v", err)
			}
			if res.Deleted != 4 {
				t.Errorf("DeleteScope: Deleted = %d, want 4", res.Deleted)
			}
			if len(res.Skipped) != 1 {
				t.Fatalf("DeleteScope: %d rows skipped, want 1 (the live in-flight row): %+v", len(res.Skipped), res.Skipped)
			}
			sameRecord(t, "skipped row", res.Skipped[0], liveRec)

			if left := exportIDs(t, s, scope); len(left) != 1 || !left[liveRec.ID] {
				t.Errorf("after DeleteScope, rows %v of the scope are left, want only %d", left, liveRec.ID)
			}
			sameRecord(t, "other scope's row", read(t, s, other), otherRec)
			sameRecord(t, "unscoped row", read(t, s, unscoped), unscopedRec)

			wantNotOwner(t, "Complete of an erased stale row", s.Complete(ctx, staleRec.Fence(), jsonResponse()))
			if err := s.Complete(ctx, liveRec.Fence(), jsonResponse()); err != nil {
				t.Errorf("Complete of the skipped live row: %v", err)
			}
			// A key retried after erasure is new.
			checkFresh(t, mustClaim(t, s, completed), completed, 1)
		})

		t.Run("UnknownScope", func(t *testing.T) {
			s, ctx := setup(t)
			req := newRequest("user-1")
			rec := mustClaim(t, s, req)
			res, err := s.DeleteScope(ctx, "user-2")
			if err != nil {
				t.Fatalf("DeleteScope: %v", err)
			}
			if res.Deleted != 0 || len(res.Skipped) != 0 {
				t.Errorf("DeleteScope of a scope without rows: %+v, want nothing", res)
			}
			sameRecord(t, "row of another scope", read(t, s, req), rec)
		})

		t.Run("EmptyScopeIsAScope", func(t *testing.T) {
			s, ctx := setup(t)
			unscoped := newRequest("")
			scoped := unscoped
			scoped.Scope = "user-1"
			unscopedRec := mustClaim(t, s, unscoped)
			if err := s.Fail(ctx, unscopedRec.Fence()); err != nil {
				t.Fatalf("Fail: %v", err)
			}
			scopedRec := mustClaim(t, s, scoped)
			if err := s.Fail(ctx, scopedRec.Fence()); err != nil {
				t.Fatalf("Fail: %v", err)
			}
			scopedRec = read(t, s, scoped)

			res, err := s.DeleteScope(ctx, "")
			if err != nil {
				t.Fatalf("DeleteScope: %v", err)
			}
			if res.Deleted != 1 || len(res.Skipped) != 0 {
				t.Errorf("DeleteScope(\"\") = %+v, want 1 deleted and none skipped", res)
			}
			if left := exportIDs(t, s, ""); len(left) != 0 {
				t.Errorf("unscoped rows %v left after DeleteScope(\"\")", left)
			}
			sameRecord(t, "scoped row", read(t, s, scoped), scopedRec)
		})
	})

	t.Run("ExportScope", func(t *testing.T) {
		t.Parallel()

		t.Run("AllRowsOfTheScopeOldestFirst", func(t *testing.T) {
			s, ctx := setup(t)
			const scope = "user-7"
			raw := rawResponse([]byte{0, 1, 2, 0xff, 'x'})
			steps := []struct {
				req    idempotency.ClaimRequest
				finish func(f idempotency.Fence) error
				status idempotency.Status
				resp   idempotency.Response
			}{
				{newRequest(scope), func(f idempotency.Fence) error { return s.Complete(ctx, f, jsonResponse()) }, idempotency.StatusCompleted, jsonResponse()},
				{request(scope, longTTL, longLease), func(f idempotency.Fence) error { return s.Complete(ctx, f, raw) }, idempotency.StatusCompleted, raw},
				{newRequest(scope), nil, idempotency.StatusInFlight, idempotency.Response{}},
				{newRequest(scope), func(f idempotency.Fence) error { return s.Fail(ctx, f) }, idempotency.StatusFailed, idempotency.Response{}},
			}
			steps[1].req.Endpoint = otherEndpoint
			var want []idempotency.Record
			for _, st := range steps {
				rec := mustClaim(t, s, st.req)
				if st.finish != nil {
					if err := st.finish(rec.Fence()); err != nil {
						t.Fatalf("finishing: %v", err)
					}
				}
				rec.Status, rec.Response = st.status, st.resp
				want = append(want, rec)
			}
			// The same key in another scope and unscoped.
			other := steps[0].req
			other.Scope = "user-8"
			otherRec := mustClaim(t, s, other)
			unscoped := steps[0].req
			unscoped.Scope = ""
			unscopedRec := mustClaim(t, s, unscoped)

			got, err := s.ExportScope(ctx, scope)
			if err != nil {
				t.Fatalf("ExportScope: %v", err)
			}
			if len(got) != len(want) {
				t.Fatalf("ExportScope: %d records, want %d: %+v", len(got), len(want), got)
			}
			for i := range want {
				sameRecord(t, fmt.Sprintf("exported record %d", i), got[i], want[i])
				if i > 0 && got[i].CreatedAt.Before(got[i-1].CreatedAt) {
					t.Errorf("exported record %d was created at %v, before record %d at %v", i, got[i].CreatedAt, i-1, got[i-1].CreatedAt)
				}
			}

			for _, sc := range []struct {
				scope string
				want  idempotency.Record
			}{{"user-8", otherRec}, {"", unscopedRec}} {
				got, err := s.ExportScope(ctx, sc.scope)
				if err != nil {
					t.Fatalf("ExportScope(%q): %v", sc.scope, err)
				}
				if len(got) != 1 {
					t.Fatalf("ExportScope(%q): %d records, want 1: %+v", sc.scope, len(got), got)
				}
				sameRecord(t, fmt.Sprintf("ExportScope(%q)", sc.scope), got[0], sc.want)
			}

			none, err := s.ExportScope(ctx, "user-9")
			if err != nil {
				t.Fatalf("ExportScope of an unknown scope: %v", err)
			}
			if len(none) != 0 {
				t.Errorf("ExportScope of an unknown scope: %d records, want 0: %+v", len(none), none)
			}
		})
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
				mustClaim(t, s, req)
				rec := waitFor(t, s, req, "expired, lease over", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
				fresh := newRequest("user-1")

				done, cancel := c.ctx(ctx)
				defer cancel()
				calls := map[string]func() error{
					"Claim": func() error { _, err := s.Claim(done, fresh); return err },
					"Takeover": func() error {
						_, err := s.Takeover(done, rec.Fence(), fresh)
						return err
					},
					"Reclaim":       func() error { _, err := s.Reclaim(done, rec.Fence(), req); return err },
					"Complete":      func() error { return s.Complete(done, rec.Fence(), jsonResponse()) },
					"Fail":          func() error { return s.Fail(done, rec.Fence()) },
					"Release":       func() error { return s.Release(done, rec.Fence()) },
					"DeleteExpired": func() error { _, err := s.DeleteExpired(done, 100); return err },
					"DeleteScope":   func() error { _, err := s.DeleteScope(done, req.Scope); return err },
					"ExportScope":   func() error { _, err := s.ExportScope(done, req.Scope); return err },
					"ReleaseOwner": func() error {
						owned := req
						owned.Owner = uuid.New()
						_, err := mustOwnerReleaser(t, s).ReleaseOwner(done, owned)
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
				sameRecord(t, "row after calls with a done context", read(t, s, req), rec)
				checkFresh(t, mustClaim(t, s, fresh), fresh, 1)
			})
		}
	})
}

// newRequest returns a claim of a new random key in scope with a long TTL
// and lease.
func newRequest(scope string) idempotency.ClaimRequest {
	return request(scope, longTTL, longLease)
}

// request returns a claim of a new random key in scope.
func request(scope string, ttl, lease time.Duration) idempotency.ClaimRequest {
	key := newKey()
	return idempotency.ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    endpoint,
		RequestHash: hashOf(key, "body"),
		TTL:         ttl,
		Lease:       lease,
	}
}

// newKey returns a random version 4 UUID in lower-case text.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// hashOf returns a request hash (64 lower-case hex characters) of parts.
func hashOf(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:])
}

// jsonResponse returns a JSON response with multi-valued headers.
func jsonResponse() idempotency.Response {
	return idempotency.Response{
		Status: 201,
		Header: http.Header{
			"Content-Type":     {"application/json"},
			"Location":         {"/api/trading/orders/42"},
			"Content-Language": {"en-GB", "de-DE", "fr"},
		},
		Body: []byte(`{"id": 42, "symbol": "AAPL", "side": "buy", "qty": 10, "status": "filled",
			"fill_price": 187.25, "tags": ["a", "b"], "note": "ünïcödé \u2028 \"quoted\"", "meta": {"none": null, "ok": true}}`),
		BodyKind: idempotency.BodyJSON,
	}
}

// rawResponse returns a raw response with body.
func rawResponse(body []byte) idempotency.Response {
	return idempotency.Response{
		Status:   200,
		Header:   http.Header{"Content-Type": {"application/octet-stream"}},
		Body:     body,
		BodyKind: idempotency.BodyRaw,
	}
}

// scribble modifies every byte and header of resp in place.
func scribble(resp idempotency.Response) {
	for i := range resp.Body {
		resp.Body[i] ^= 0xff
	}
	for _, vs := range resp.Header {
		for i := range vs {
			vs[i] = "scribbled"
		}
	}
	if resp.Header != nil {
		resp.Header.Set("X-Scribbled", "1")
	}
}

// mustClaim claims req, which must be a new key, and returns its record.
func mustClaim(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest) idempotency.Record {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if !res.Won {
		t.Fatalf("Claim of a new key: Won = false; existing record %+v", res.Record)
	}
	return res.Record
}

// read returns the row of req's key, which must exist, through Claim.
func read(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest) idempotency.Record {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Won {
		t.Fatalf("Claim of an existing key won: the row was gone")
	}
	return res.Record
}

// waitFor polls req's row until cond holds and returns it. The store's
// clock decides, so a row given a tiny TTL or lease is polled, never slept
// on: for Postgres it expires for the next statement only once that much
// time has passed on the database's clock.
func waitFor(t testing.TB, s idempotency.Store, req idempotency.ClaimRequest, what string, cond func(idempotency.Record) bool) idempotency.Record {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		rec := read(t, s, req)
		if cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("row not %s after %v: %+v", what, waitBound, rec)
		}
		time.Sleep(time.Millisecond)
	}
}

func isExpired(r idempotency.Record) bool   { return r.Expired }
func isLeaseOver(r idempotency.Record) bool { return r.LeaseOver }

// race runs f(0..n-1) in n goroutines released at once and waits for all.
func race(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// onlyWinner checks that exactly one of results won, and that the losers
// got the zero Record, and returns the winner's index.
func onlyWinner(t testing.TB, results []idempotency.ClaimResult) int {
	t.Helper()
	winner := -1
	for i, res := range results {
		switch {
		case res.Won && winner >= 0:
			t.Fatalf("racers %d and %d both won", winner, i)
		case res.Won:
			winner = i
		case !reflect.DeepEqual(res.Record, idempotency.Record{}):
			t.Errorf("loser %d got record %+v, want the zero Record", i, res.Record)
		}
	}
	if winner < 0 {
		t.Fatalf("none of %d racers won", len(results))
	}
	return winner
}

// lostTakeover checks that a takeover of f loses without an error.
func lostTakeover(t testing.TB, s idempotency.Store, f idempotency.Fence, req idempotency.ClaimRequest, what string) {
	t.Helper()
	res, err := s.Takeover(t.Context(), f, req)
	if err != nil {
		t.Fatalf("Takeover %s: %v", what, err)
	}
	if res.Won || !reflect.DeepEqual(res.Record, idempotency.Record{}) {
		t.Fatalf("Takeover %s: won %v with record %+v, want a loss and the zero Record", what, res.Won, res.Record)
	}
}

// lostReclaim checks that a reclaim of f loses without an error.
func lostReclaim(t testing.TB, s idempotency.Store, f idempotency.Fence, req idempotency.ClaimRequest, what string) {
	t.Helper()
	res, err := s.Reclaim(t.Context(), f, req)
	if err != nil {
		t.Fatalf("Reclaim %s: %v", what, err)
	}
	if res.Won || !reflect.DeepEqual(res.Record, idempotency.Record{}) {
		t.Fatalf("Reclaim %s: won %v with record %+v, want a loss and the zero Record", what, res.Won, res.Record)
	}
}

// wantNotOwner checks that err is ErrNotOwner and not a store failure.
func wantNotOwner(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrNotOwner) || errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("%s: error %v, want ErrNotOwner", what, err)
	}
}

// exportIDs returns the ids of the scope's rows.
func exportIDs(t testing.TB, s idempotency.Store, scope string) map[int64]bool {
	t.Helper()
	recs, err := s.ExportScope(t.Context(), scope)
	if err != nil {
		t.Fatalf("ExportScope: %v", err)
	}
	ids := make(map[int64]bool, len(recs))
	for _, r := range recs {
		ids[r.ID] = true
	}
	return ids
}

// checkFresh checks rec is a new in_flight claim of req at attempt.
func checkFresh(t testing.TB, rec idempotency.Record, req idempotency.ClaimRequest, attempt int32) {
	t.Helper()
	if rec.ID <= 0 {
		t.Errorf("claimed record: ID = %d, want > 0", rec.ID)
	}
	if rec.Key != req.Key || rec.Scope != req.Scope || rec.Endpoint != req.Endpoint {
		t.Errorf("claimed record is (%q, %q, %q), want (%q, %q, %q)", rec.Key, rec.Scope, rec.Endpoint, req.Key, req.Scope, req.Endpoint)
	}
	if rec.RequestHash != req.RequestHash {
		t.Errorf("claimed record: RequestHash = %q, want %q", rec.RequestHash, req.RequestHash)
	}
	if rec.Status != idempotency.StatusInFlight {
		t.Errorf("claimed record: Status = %q, want %q", rec.Status, idempotency.StatusInFlight)
	}
	if rec.Attempt != attempt {
		t.Errorf("claimed record: Attempt = %d, want %d", rec.Attempt, attempt)
	}
	if d := diffResponse(rec.Response, idempotency.Response{}); d != "" {
		t.Errorf("claimed record has a response: %s", d)
	}
	if rec.CreatedAt.IsZero() || rec.LockedAt.IsZero() {
		t.Errorf("claimed record: CreatedAt %v, LockedAt %v, want both set", rec.CreatedAt, rec.LockedAt)
	}
	checkDuration(t, "LockedAt - CreatedAt", rec.LockedAt.Sub(rec.CreatedAt), 0)
	checkDuration(t, "ExpiresAt - CreatedAt", rec.ExpiresAt.Sub(rec.CreatedAt), req.TTL)
	checkDuration(t, "LockedUntil - LockedAt", rec.LockedUntil.Sub(rec.LockedAt), req.Lease)
	if rec.Expired || rec.LeaseOver {
		t.Errorf("claimed record with TTL %v and lease %v: Expired %v, LeaseOver %v, want both false", req.TTL, req.Lease, rec.Expired, rec.LeaseOver)
	}
}

// checkDuration checks got is want within tolerance.
func checkDuration(t testing.TB, what string, got, want time.Duration) {
	t.Helper()
	if d := got - want; d < -tolerance || d > tolerance {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// sameRecord reports whether got and want describe the same row in the
// same state, and reports each difference. The flags Expired and LeaseOver
// are left out: they depend on when the row was read.
func sameRecord(t testing.TB, what string, got, want idempotency.Record) bool {
	t.Helper()
	var diffs []string
	add := func(field string, g, w any) { diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.ID != want.ID {
		add("ID", got.ID, want.ID)
	}
	if got.Key != want.Key {
		add("Key", got.Key, want.Key)
	}
	if got.Scope != want.Scope {
		add("Scope", got.Scope, want.Scope)
	}
	if got.Endpoint != want.Endpoint {
		add("Endpoint", got.Endpoint, want.Endpoint)
	}
	if got.RequestHash != want.RequestHash {
		add("RequestHash", got.RequestHash, want.RequestHash)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if got.Attempt != want.Attempt {
		add("Attempt", got.Attempt, want.Attempt)
	}
	for _, tm := range []struct {
		field     string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"LockedAt", got.LockedAt, want.LockedAt},
		{"LockedUntil", got.LockedUntil, want.LockedUntil},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
	} {
		if !tm.got.Equal(tm.want) {
			add(tm.field, tm.got, tm.want)
		}
	}
	if d := diffResponse(got.Response, want.Response); d != "" {
		diffs = append(diffs, "Response: "+d)
	}
	if len(diffs) > 0 {
		t.Errorf("%s differs:\n\t%s", what, strings.Join(diffs, "\n\t"))
		return false
	}
	return true
}

// diffResponse describes how got differs from want, or returns "". A JSON
// body is compared as a JSON value (a database may normalise its text),
// any other body byte for byte; an empty header equals a nil one.
func diffResponse(got, want idempotency.Response) string {
	var diffs []string
	if got.Status != want.Status {
		diffs = append(diffs, fmt.Sprintf("Status = %d, want %d", got.Status, want.Status))
	}
	if got.BodyKind != want.BodyKind {
		diffs = append(diffs, fmt.Sprintf("BodyKind = %d, want %d", got.BodyKind, want.BodyKind))
	}
	if want.BodyKind == idempotency.BodyJSON {
		if !jsonEqual(got.Body, want.Body) {
			diffs = append(diffs, fmt.Sprintf("JSON body = %s, want %s", got.Body, want.Body))
		}
	} else if !bytes.Equal(got.Body, want.Body) {
		diffs = append(diffs, fmt.Sprintf("body = %q, want %q", got.Body, want.Body))
	}
	if (len(got.Header) != 0 || len(want.Header) != 0) && !reflect.DeepEqual(got.Header, want.Header) {
		diffs = append(diffs, fmt.Sprintf("Header = %v, want %v", got.Header, want.Header))
	}
	return strings.Join(diffs, "; ")
}

// jsonEqual reports whether a and b are valid JSON encoding the same value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// ownerTests is the suite's part on owner tokens (ClaimRequest.Owner and
// idempotency.OwnerReleaser).
func ownerTests(t *testing.T, setup func(t *testing.T) (idempotency.Store, context.Context)) {
	t.Run("OwnClaimWinsAgain", func(t *testing.T) {
		// The claim's reply was lost: the same request claims again and
		// gets its own row as won, unchanged; anyone else reads it.
		s, ctx := setup(t)
		req := ownedRequest("user-1", longTTL, longLease)
		first := mustClaim(t, s, req)
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
		sameRecord(t, "row read without a token", read(t, s, unowned(req)), first)
	})

	t.Run("NoTokenNeverOwns", func(t *testing.T) {
		s, _ := setup(t)
		req := request("user-1", longTTL, longLease) // no owner
		first := mustClaim(t, s, req)
		sameRecord(t, "second claim without a token", read(t, s, req), first)
	})

	for _, fin := range []struct {
		name   string
		finish func(idempotency.Store, context.Context, idempotency.Fence) error
		status idempotency.Status
	}{
		{"Completed", func(s idempotency.Store, ctx context.Context, f idempotency.Fence) error {
			return s.Complete(ctx, f, jsonResponse())
		}, idempotency.StatusCompleted},
		{"Failed", func(s idempotency.Store, ctx context.Context, f idempotency.Fence) error {
			return s.Fail(ctx, f)
		}, idempotency.StatusFailed},
	} {
		t.Run("Not"+fin.name+"Row", func(t *testing.T) {
			// A finished row is never won again nor released, even by
			// its owner: its handler ran.
			s, ctx := setup(t)
			req := ownedRequest("user-1", longTTL, longLease)
			rec := mustClaim(t, s, req)
			if err := fin.finish(s, ctx, rec.Fence()); err != nil {
				t.Fatalf("finish: %v", err)
			}
			res, err := s.Claim(ctx, req)
			if err != nil || res.Won || res.Record.Status != fin.status {
				t.Fatalf("Claim of its own %s row: won %v status %q, %v; want lost, %q", fin.name, res.Won, res.Record.Status, err, fin.status)
			}
			released, err := mustOwnerReleaser(t, s).ReleaseOwner(ctx, req)
			if err != nil || released {
				t.Fatalf("ReleaseOwner of a %s row: %v, %v; want false", fin.name, released, err)
			}
			if got := read(t, s, unowned(req)); got.Status != fin.status {
				t.Errorf("row after ReleaseOwner: status %q, want %q", got.Status, fin.status)
			}
		})
	}

	t.Run("NotWonAfterLeaseOver", func(t *testing.T) {
		// The lease ran out: the owner's claim is stale, not won again;
		// ReleaseOwner may still free it, the handler never having run.
		s, ctx := setup(t)
		req := ownedRequest("user-1", longTTL, tiny)
		mustClaim(t, s, req)
		stale := waitFor(t, s, unowned(req), "lease over", isLeaseOver)
		res, err := s.Claim(ctx, req)
		if err != nil || res.Won {
			t.Fatalf("Claim of its own row after the lease: won %v, %v; want lost", res.Won, err)
		}
		if res.Record.Fence() != stale.Fence() {
			t.Errorf("row changed: fence %+v, want %+v", res.Record.Fence(), stale.Fence())
		}
		released, err := mustOwnerReleaser(t, s).ReleaseOwner(ctx, req)
		if err != nil || !released {
			t.Fatalf("ReleaseOwner of its stale in_flight row: %v, %v; want true", released, err)
		}
		checkFresh(t, mustClaim(t, s, unowned(req)), req, 1)
	})

	t.Run("ReleaseOwnerDeletesOnlyItsInFlightRow", func(t *testing.T) {
		s, ctx := setup(t)
		r := mustOwnerReleaser(t, s)
		req := ownedRequest("user-1", longTTL, longLease)
		rec := mustClaim(t, s, req)
		neighbour := req // the same key of another endpoint, same token
		neighbour.Endpoint = otherEndpoint
		nrec := mustClaim(t, s, neighbour)

		wrong := map[string]func(*idempotency.ClaimRequest){
			"another token": func(q *idempotency.ClaimRequest) { q.Owner = uuid.New() },
			"no token":      func(q *idempotency.ClaimRequest) { q.Owner = uuid.Nil },
			"another scope": func(q *idempotency.ClaimRequest) { q.Scope = "user-2" },
			"no scope":      func(q *idempotency.ClaimRequest) { q.Scope = "" },
			"another key":   func(q *idempotency.ClaimRequest) { q.Key = newKey() },
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
		sameRecord(t, "row after the refused releases", read(t, s, unowned(req)), rec)

		released, err := r.ReleaseOwner(ctx, req)
		if err != nil || !released {
			t.Fatalf("ReleaseOwner with the owner token: %v, %v; want true", released, err)
		}
		if released, err := r.ReleaseOwner(ctx, req); err != nil || released {
			t.Errorf("second ReleaseOwner: %v, %v; want false", released, err)
		}
		// Only that row went: the other endpoint's row stays.
		sameRecord(t, "the other endpoint's row", read(t, s, unowned(neighbour)), nrec)
		if ids := exportIDs(t, s, req.Scope); len(ids) != 1 || !ids[nrec.ID] {
			t.Errorf("rows of the scope after ReleaseOwner: %v, want only %d", ids, nrec.ID)
		}
		// The key is free: a new request claims it as new.
		next := req
		next.Owner = uuid.New()
		checkFresh(t, mustClaim(t, s, next), next, 1)
	})

	t.Run("TakeoverCarriesItsOwner", func(t *testing.T) {
		s, ctx := setup(t)
		r := mustOwnerReleaser(t, s)
		first := ownedRequest("user-1", tiny, tiny)
		rec := mustClaim(t, s, first)
		if err := s.Complete(ctx, rec.Fence(), jsonResponse()); err != nil {
			t.Fatal(err)
		}
		expired := waitFor(t, s, unowned(first), "expired", isExpired)
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
	})

	t.Run("TakeoverWithoutTokenClearsIt", func(t *testing.T) {
		s, ctx := setup(t)
		first := ownedRequest("user-1", tiny, tiny)
		rec := mustClaim(t, s, first)
		if err := s.Fail(ctx, rec.Fence()); err != nil {
			t.Fatal(err)
		}
		expired := waitFor(t, s, unowned(first), "expired", isExpired)
		second := unowned(first)
		second.TTL, second.Lease = longTTL, longLease
		if res, err := s.Takeover(ctx, expired.Fence(), second); err != nil || !res.Won {
			t.Fatalf("Takeover: %+v, %v", res, err)
		}
		if released, err := mustOwnerReleaser(t, s).ReleaseOwner(ctx, first); err != nil || released {
			t.Errorf("ReleaseOwner by the first owner after a takeover without a token: %v, %v; want false", released, err)
		}
	})

	t.Run("ReclaimCarriesItsOwner", func(t *testing.T) {
		s, ctx := setup(t)
		r := mustOwnerReleaser(t, s)
		first := ownedRequest("user-1", longTTL, tiny)
		first.Reclaimable = true
		mustClaim(t, s, first)
		stale := waitFor(t, s, unowned(first), "lease over", isLeaseOver)
		second := first
		second.Lease, second.Owner = longLease, uuid.New()
		res, err := s.Reclaim(ctx, stale.Fence(), second)
		if err != nil || !res.Won {
			t.Fatalf("Reclaim: %+v, %v", res, err)
		}
		if released, err := r.ReleaseOwner(ctx, first); err != nil || released {
			t.Errorf("ReleaseOwner by the stale owner after a reclaim: %v, %v; want false", released, err)
		}
		if got, err := s.Claim(ctx, second); err != nil || !got.Won || got.Record.Fence() != res.Record.Fence() {
			t.Errorf("Claim with the reclaimer's token: won %v fence %+v, %v; want won, %+v", got.Won, got.Record.Fence(), err, res.Record.Fence())
		}
		if released, err := r.ReleaseOwner(ctx, second); err != nil || !released {
			t.Errorf("ReleaseOwner by the reclaimer: %v, %v; want true", released, err)
		}
	})

	t.Run("FencedCallsNeedTheScope", func(t *testing.T) {
		// A fence names the row's scope: with another one, a takeover or
		// reclaim changes nothing.
		s, _ := setup(t)
		req := request("user-1", tiny, tiny)
		req.Reclaimable = true
		mustClaim(t, s, req)
		rec := waitFor(t, s, req, "expired, lease over", func(r idempotency.Record) bool { return r.Expired && r.LeaseOver })
		for _, scope := range []string{"", "user-2"} {
			f := rec.Fence()
			f.Scope = scope
			lostTakeover(t, s, f, newRequest("user-1"), fmt.Sprintf("with the scope %q", scope))
			lostReclaim(t, s, f, req, fmt.Sprintf("with the scope %q", scope))
		}
		sameRecord(t, "row after the refused calls", read(t, s, req), rec)
	})
}

// ownedRequest returns a claim of a new random key with a fresh owner token.
func ownedRequest(scope string, ttl, lease time.Duration) idempotency.ClaimRequest {
	req := request(scope, ttl, lease)
	req.Owner = uuid.New()
	return req
}

// unowned returns req without its owner token, to read its row as anyone
// else would.
func unowned(req idempotency.ClaimRequest) idempotency.ClaimRequest {
	req.Owner = uuid.Nil
	return req
}

// mustOwnerReleaser returns s as an OwnerReleaser, which every store of
// this module implements.
func mustOwnerReleaser(t testing.TB, s idempotency.Store) idempotency.OwnerReleaser {
	t.Helper()
	r, ok := s.(idempotency.OwnerReleaser)
	if !ok {
		t.Fatalf("%T does not implement idempotency.OwnerReleaser", s)
	}
	return r
}
