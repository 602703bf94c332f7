package idempotencytest

import (
	"fmt"
	"testing"

	"github.com/idemkit/idempotency"
)

// runMaintenance checks Cleanup, Erase and ExportScope.
func runMaintenance(t *testing.T, setup setupFunc) {
	t.Run("Cleanup", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletesOnlyExpiredRowsNoOneOwns", func(t *testing.T) { cleanupDeletesOnlyExpiredRowsNoOneOwns(t, setup) })

		t.Run("HonoursLimit", func(t *testing.T) { cleanupHonoursLimit(t, setup) })
	})

	t.Run("Erase", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletesAllButLiveInFlightRows", func(t *testing.T) { eraseDeletesAllButLiveInFlightRows(t, setup) })

		t.Run("UnknownScope", func(t *testing.T) { eraseUnknownScope(t, setup) })

		t.Run("EmptyScopeIsAScope", func(t *testing.T) { eraseEmptyScopeIsAScope(t, setup) })
	})

	t.Run("ExportScope", func(t *testing.T) {
		t.Parallel()

		t.Run("AllRowsOfTheScopeOldestFirst", func(t *testing.T) { exportScopeAllRowsOfTheScopeOldestFirst(t, setup) })
	})
}

// cleanupDeletesOnlyExpiredRowsNoOneOwns is the subtest Cleanup/DeletesOnlyExpiredRowsNoOneOwns.
func cleanupDeletesOnlyExpiredRowsNoOneOwns(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	const scope = "user-1"
	type row struct {
		req      idempotency.ClaimRequest
		rec      idempotency.Record
		finish   string // "complete", "fail" or "" (stays in flight)
		deletion bool   // cleanup must delete it
	}
	rows := map[string]*row{
		"expired completed":             {req: Request(scope, tiny, longLease), finish: "complete", deletion: true},
		"expired failed":                {req: Request(scope, tiny, longLease), finish: "fail", deletion: true},
		"expired in_flight, lease over": {req: Request(scope, tiny, tiny), deletion: true},
		"expired in_flight, live lease": {req: Request(scope, tiny, longTTL)},
		"live completed":                {req: Request(scope, longTTL, longLease), finish: "complete"},
		"live in_flight, lease over":    {req: Request(scope, longTTL, tiny)},
	}
	for name, r := range rows {
		r.rec = MustClaim(t, s, r.req)
		var err error
		switch r.finish {
		case "complete":
			err = s.Complete(ctx, r.rec.Fence(), r.rec, jsonResponse())
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
		got := WaitFor(t, s, r.req, name, func(rec idempotency.Record) bool {
			return (!wantExpired || rec.Expired) && (!wantLeaseOver || rec.LeaseOver)
		})
		if got.Expired != wantExpired || got.LeaseOver != wantLeaseOver {
			t.Fatalf("%s: Expired %v, LeaseOver %v; want %v, %v", name, got.Expired, got.LeaseOver, wantExpired, wantLeaseOver)
		}
	}

	n, err := s.Cleanup(ctx, 100)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if n != 3 {
		t.Errorf("Cleanup = %d, want 3", n)
	}
	left := exportIDs(t, s, scope)
	for name, r := range rows {
		if _, ok := left[r.rec.ID]; ok == r.deletion {
			t.Errorf("after cleanup, %s is present = %v, want %v", name, ok, !r.deletion)
		}
	}
	if n, err := s.Cleanup(ctx, 100); err != nil || n != 0 {
		t.Errorf("second Cleanup = %d, %v; want 0, nil", n, err)
	}

	// The live owner still owns its key; the orphan's owner does not.
	if err := s.Complete(ctx, rows["expired in_flight, live lease"].rec.Fence(), rows["expired in_flight, live lease"].rec, jsonResponse()); err != nil {
		t.Errorf("Complete by the owner of a live lease after cleanup: %v", err)
	}
	wantNotOwner(t, "Complete of a cleaned-up orphan", s.Complete(ctx, rows["expired in_flight, lease over"].rec.Fence(), rows["expired in_flight, lease over"].rec, jsonResponse()))
	// A cleaned-up key is new again.
	checkFresh(t, MustClaim(t, s, rows["expired completed"].req), rows["expired completed"].req, 1)
}

// cleanupHonoursLimit is the subtest Cleanup/HonoursLimit.
func cleanupHonoursLimit(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	const scope, expired = "user-1", 5
	for range expired {
		req := Request(scope, tiny, longLease)
		rec := MustClaim(t, s, req)
		if err := s.Complete(ctx, rec.Fence(), rec, jsonResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		WaitFor(t, s, req, "expired", isExpired)
	}
	live := MustClaim(t, s, Request(scope, longTTL, longLease))

	// A limit of zero deletes nothing.
	if n, err := s.Cleanup(ctx, 0); err != nil || n != 0 {
		t.Errorf("Cleanup(0) = %d, %v; want 0, nil", n, err)
	}
	if left := exportIDs(t, s, scope); len(left) != expired+1 {
		t.Fatalf("after Cleanup(0), %d rows left, want %d", len(left), expired+1)
	}

	// Batches as cleanup runs them: until one deletes nothing.
	var total int64
	for i := 0; ; i++ {
		if i > expired {
			t.Fatalf("Cleanup still deleting after %d calls", i)
		}
		limit := 1 + i%2
		n, err := s.Cleanup(ctx, limit)
		if err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if n < 0 || n > int64(limit) {
			t.Fatalf("Cleanup(%d) = %d", limit, n)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != expired {
		t.Errorf("Cleanup deleted %d rows in all, want %d", total, expired)
	}
	left := exportIDs(t, s, scope)
	if _, ok := left[live.ID]; !ok || len(left) != 1 {
		t.Errorf("after cleanup, rows %v are left, want only the live row %d", left, live.ID)
	}
}

// eraseDeletesAllButLiveInFlightRows is the subtest Erase/DeletesAllButLiveInFlightRows.
func eraseDeletesAllButLiveInFlightRows(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	const scope = "user-42"
	completed := Request(scope, longTTL, longLease)
	failed := Request(scope, longTTL, longLease)
	expired := Request(scope, tiny, longLease)
	stale := Request(scope, longTTL, tiny)
	live := Request(scope, longTTL, longLease)
	completedRec := MustClaim(t, s, completed)
	failedRec := MustClaim(t, s, failed)
	expiredRec := MustClaim(t, s, expired)
	staleRec := MustClaim(t, s, stale)
	liveRec := MustClaim(t, s, live)
	if err := s.Complete(ctx, completedRec.Fence(), completedRec, jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := s.Fail(ctx, failedRec.Fence()); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	if err := s.Complete(ctx, expiredRec.Fence(), expiredRec, jsonResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	WaitFor(t, s, expired, "expired", isExpired)
	WaitFor(t, s, stale, "lease over", isLeaseOver)

	// The same key in other scopes, the unscoped one included.
	other := completed
	other.Scope = "user-43"
	otherRec := MustClaim(t, s, other)
	unscoped := completed
	unscoped.Scope = ""
	unscopedRec := MustClaim(t, s, unscoped)

	res, err := s.Erase(ctx, scope)
	if err != nil {
		t.Fatalf("Erase: %v", err)
	}
	if res.Deleted != 4 {
		t.Errorf("Erase: Deleted = %d, want 4", res.Deleted)
	}
	if len(res.Skipped) != 1 {
		t.Fatalf("Erase: %d rows skipped, want 1 (the live in-flight row): %+v", len(res.Skipped), res.Skipped)
	}
	sameRecord(t, "skipped row", res.Skipped[0], liveRec)

	if left := exportIDs(t, s, scope); len(left) != 1 || !left[liveRec.ID] {
		t.Errorf("after Erase, rows %v of the scope are left, want only %d", left, liveRec.ID)
	}
	sameRecord(t, "other scope's row", Read(t, s, other), otherRec)
	sameRecord(t, "unscoped row", Read(t, s, unscoped), unscopedRec)

	wantNotOwner(t, "Complete of an erased stale row", s.Complete(ctx, staleRec.Fence(), staleRec, jsonResponse()))
	if err := s.Complete(ctx, liveRec.Fence(), liveRec, jsonResponse()); err != nil {
		t.Errorf("Complete of the skipped live row: %v", err)
	}
	// A key retried after erasure is new.
	checkFresh(t, MustClaim(t, s, completed), completed, 1)
}

// eraseUnknownScope is the subtest Erase/UnknownScope.
func eraseUnknownScope(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	req := newRequest("user-1")
	rec := MustClaim(t, s, req)
	res, err := s.Erase(ctx, "user-2")
	if err != nil {
		t.Fatalf("Erase: %v", err)
	}
	if res.Deleted != 0 || len(res.Skipped) != 0 {
		t.Errorf("Erase of a scope without rows: %+v, want nothing", res)
	}
	sameRecord(t, "row of another scope", Read(t, s, req), rec)
}

// eraseEmptyScopeIsAScope is the subtest Erase/EmptyScopeIsAScope.
func eraseEmptyScopeIsAScope(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	unscoped := newRequest("")
	scoped := unscoped
	scoped.Scope = "user-1"
	unscopedRec := MustClaim(t, s, unscoped)
	if err := s.Fail(ctx, unscopedRec.Fence()); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	scopedRec := MustClaim(t, s, scoped)
	if err := s.Fail(ctx, scopedRec.Fence()); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	scopedRec = Read(t, s, scoped)

	res, err := s.Erase(ctx, "")
	if err != nil {
		t.Fatalf("Erase: %v", err)
	}
	if res.Deleted != 1 || len(res.Skipped) != 0 {
		t.Errorf("Erase(\"\") = %+v, want 1 deleted and none skipped", res)
	}
	if left := exportIDs(t, s, ""); len(left) != 0 {
		t.Errorf("unscoped rows %v left after Erase(\"\")", left)
	}
	sameRecord(t, "scoped row", Read(t, s, scoped), scopedRec)
}

// exportScopeAllRowsOfTheScopeOldestFirst is the subtest ExportScope/AllRowsOfTheScopeOldestFirst.
func exportScopeAllRowsOfTheScopeOldestFirst(t *testing.T, setup setupFunc) {
	s, ctx := setup(t)
	const scope = "user-7"
	raw := rawResponse([]byte{0, 1, 2, 0xff, 'x'})
	steps := []struct {
		req    idempotency.ClaimRequest
		finish func(rec idempotency.Record) error
		status idempotency.Status
		resp   idempotency.Response
	}{
		{newRequest(scope), func(r idempotency.Record) error { return s.Complete(ctx, r.Fence(), r, jsonResponse()) }, idempotency.StatusCompleted, jsonResponse()},
		{Request(scope, longTTL, longLease), func(r idempotency.Record) error { return s.Complete(ctx, r.Fence(), r, raw) }, idempotency.StatusCompleted, raw},
		{newRequest(scope), nil, idempotency.StatusInFlight, idempotency.Response{}},
		{newRequest(scope), func(r idempotency.Record) error { return s.Fail(ctx, r.Fence()) }, idempotency.StatusFailed, idempotency.Response{}},
	}
	steps[1].req.Endpoint = otherEndpoint
	var want []idempotency.Record
	for _, st := range steps {
		rec := MustClaim(t, s, st.req)
		if st.finish != nil {
			if err := st.finish(rec); err != nil {
				t.Fatalf("finishing: %v", err)
			}
		}
		rec.Status, rec.Response = st.status, st.resp
		want = append(want, rec)
	}
	// The same key in another scope and unscoped.
	other := steps[0].req
	other.Scope = "user-8"
	otherRec := MustClaim(t, s, other)
	unscoped := steps[0].req
	unscoped.Scope = ""
	unscopedRec := MustClaim(t, s, unscoped)

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
}
