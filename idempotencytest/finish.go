package idempotencytest

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency"
)

// runFinish checks the fenced outcomes of a claim: Complete, Fail and
// Release, each only while the claim's fence still owns the row.
func runFinish(t *testing.T, setup setupFunc) {
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
				rec := MustClaim(t, s, req)
				if err := s.Complete(ctx, rec.Fence(), rec, tc.resp); err != nil {
					t.Fatalf("Complete: %v", err)
				}
				got := Read(t, s, req)
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

		t.Run("StoresAndReturnsCopies", func(t *testing.T) { completeStoresAndReturnsCopies(t, setup) })

		t.Run("SecondCompleteIsNotOwner", func(t *testing.T) { completeSecondCompleteIsNotOwner(t, setup) })

		t.Run("KeepsSealedResponse", func(t *testing.T) { completeKeepsSealedResponse(t, setup) })
	})

	t.Run("Fail", func(t *testing.T) {
		t.Parallel()

		t.Run("MarksFailed", func(t *testing.T) { failMarksFailed(t, setup) })
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()

		t.Run("NewClaimWins", func(t *testing.T) { releaseNewClaimWins(t, setup) })
	})

	t.Run("Fence", func(t *testing.T) {
		t.Parallel()

		t.Run("WrongFenceIsNotOwner", func(t *testing.T) { fenceWrongFenceIsNotOwner(t, setup) })

		t.Run("GoneRowIsNotOwner", func(t *testing.T) { fenceGoneRowIsNotOwner(t, setup) })
	})
}

// completeKeepsSealedResponse is the subtest Complete/KeepsSealedResponse:
// a sealed response (Response.SealKeyID set) reads back exactly as stored,
// its key id with it, or is refused with reason unseal (a sealing store
// without that key); never as a plain response, whose bytes would then
// be replayed.
func completeKeepsSealedResponse(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	sealed := idempotency.Response{Status: 201, Body: []byte{1, 0xde, 0xad, 0, 0xbe, 0xef}, BodyKind: idempotency.BodyRaw,
		SealKeyID: "idempotencytest-key"}
	if err := s.Complete(ctx, rec.Fence(), rec, sealed); err != nil {
		t.Fatalf("Complete of a sealed response: %v", err)
	}
	res, err := s.Claim(ctx, req)
	if err != nil {
		if r := StoreReason(t, "Claim of a sealed row", err); r != idempotency.ReasonUnseal {
			t.Fatalf("Claim of a sealed row: reason %q, want the row or reason unseal", r)
		}
		return
	}
	want := rec
	want.Status, want.Response = idempotency.StatusCompleted, sealed
	sameRecord(t, "sealed row", res.Record, want)
}

// completeStoresAndReturnsCopies is the subtest Complete/StoresAndReturnsCopies.
func completeStoresAndReturnsCopies(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	want := idempotency.Response{
		Status:   201,
		Header:   http.Header{"Content-Type": {"text/plain"}, "X-Multi": {"a", "b"}},
		Body:     []byte("hello"),
		BodyKind: idempotency.BodyRaw,
	}
	// The caller's buffers, reused after Complete returns.
	resp := idempotency.Response{Status: want.Status, Header: want.Header.Clone(), Body: bytes.Clone(want.Body), BodyKind: want.BodyKind}
	if err := s.Complete(ctx, rec.Fence(), rec, resp); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	copy(resp.Body, "HELLO")
	resp.Header["X-Multi"][0] = "z"
	resp.Header.Set("Content-Type", "image/png")
	resp.Header.Set("X-Added", "1")

	got := Read(t, s, req)
	if d := diffResponse(got.Response, want); d != "" {
		t.Fatalf("after the caller reused its buffers: %s", d)
	}
	// Records handed out are copies too.
	scribble(got.Response)
	if d := diffResponse(Read(t, s, req).Response, want); d != "" {
		t.Fatalf("after a Claim's record was modified: %s", d)
	}
	recs, err := s.ExportScope(ctx, req.Scope)
	if err != nil || len(recs) != 1 {
		t.Fatalf("ExportScope: %d records, err %v; want 1", len(recs), err)
	}
	scribble(recs[0].Response)
	if d := diffResponse(Read(t, s, req).Response, want); d != "" {
		t.Fatalf("after an exported record was modified: %s", d)
	}
}

// completeSecondCompleteIsNotOwner is the subtest Complete/SecondCompleteIsNotOwner.
func completeSecondCompleteIsNotOwner(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	first := jsonResponse()
	if err := s.Complete(ctx, rec.Fence(), rec, first); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := rec
	want.Status = idempotency.StatusCompleted
	want.Response = first

	wantNotOwner(t, "second Complete", s.Complete(ctx, rec.Fence(), rec, rawResponse([]byte("second"))))
	wantNotOwner(t, "Fail after Complete", s.Fail(ctx, rec.Fence()))
	wantNotOwner(t, "Release after Complete", s.Release(ctx, rec.Fence()))
	sameRecord(t, "completed row", Read(t, s, req), want)
}

// failMarksFailed is the subtest Fail/MarksFailed.
func failMarksFailed(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	if err := s.Fail(ctx, rec.Fence()); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	want := rec
	want.Status = idempotency.StatusFailed
	sameRecord(t, "failed row", Read(t, s, req), want)

	wantNotOwner(t, "Complete after Fail", s.Complete(ctx, rec.Fence(), rec, jsonResponse()))
	wantNotOwner(t, "second Fail", s.Fail(ctx, rec.Fence()))
	wantNotOwner(t, "Release after Fail", s.Release(ctx, rec.Fence()))
	sameRecord(t, "failed row after the refused calls", Read(t, s, req), want)
}

// releaseNewClaimWins is the subtest Release/NewClaimWins.
func releaseNewClaimWins(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	old := MustClaim(t, s, req)
	if err := s.Release(ctx, old.Fence()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	again := req
	again.RequestHash = HashOf("the retry's body")
	rec := MustClaim(t, s, again)
	checkFresh(t, rec, again, 1)
	// A reused id would let the old owner's fence match the new row.
	if rec.ID == old.ID {
		t.Fatalf("the claim after Release reused row id %d", rec.ID)
	}

	wantNotOwner(t, "Complete by the released owner", s.Complete(ctx, old.Fence(), old, jsonResponse()))
	wantNotOwner(t, "Fail by the released owner", s.Fail(ctx, old.Fence()))
	wantNotOwner(t, "Release by the released owner", s.Release(ctx, old.Fence()))
	sameRecord(t, "new row", Read(t, s, again), rec)
}

// fenceWrongFenceIsNotOwner is the subtest Fence/WrongFenceIsNotOwner.
func fenceWrongFenceIsNotOwner(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
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
		wantNotOwner(t, fmt.Sprintf("Complete with fence %+v", w), s.Complete(ctx, w, rec, jsonResponse()))
		wantNotOwner(t, fmt.Sprintf("Fail with fence %+v", w), s.Fail(ctx, w))
		wantNotOwner(t, fmt.Sprintf("Release with fence %+v", w), s.Release(ctx, w))
	}
	sameRecord(t, "row after the refused calls", Read(t, s, req), rec)

	// The right fence still owns it.
	if err := s.Complete(ctx, f, rec, jsonResponse()); err != nil {
		t.Fatalf("Complete with the owner's fence: %v", err)
	}
}

// fenceGoneRowIsNotOwner is the subtest Fence/GoneRowIsNotOwner.
func fenceGoneRowIsNotOwner(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	if err := s.Release(ctx, rec.Fence()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantNotOwner(t, "Complete of a released row", s.Complete(ctx, rec.Fence(), rec, jsonResponse()))
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
	checkFresh(t, MustClaim(t, s, req), req, 1)
}
