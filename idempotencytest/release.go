package idempotencytest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/operator"
)

// runRelease checks an operator's release of one stuck key (the CLI's
// release), for the stores of this module that register one in
// internal/operator.
func runRelease(t *testing.T, setup setupFunc) {
	t.Run("KeyRelease", func(t *testing.T) {
		t.Parallel()
		releaseTests(t, setup)
	})
}

// keyReleaser is a store's operator lookup and release of one key.
type keyReleaser struct {
	ops operator.Store[idempotency.Record, idempotency.Fence]
}

// keyRows are the rows of one key and the store's time, as Lookup read them.
type keyRows struct {
	Records []idempotency.Record
	Now     time.Time
}

func (kr keyReleaser) Lookup(ctx context.Context, key, scope, endpoint string) (keyRows, error) {
	recs, now, err := kr.ops.Lookup(ctx, key, scope, endpoint)
	return keyRows{recs, now}, err
}

func (kr keyReleaser) ReleaseKey(ctx context.Context, f idempotency.Fence) (bool, error) {
	return kr.ops.ReleaseKey(ctx, f)
}

// releaser returns the operator release of s, skipping the test for a
// store without one.
func releaser(t *testing.T, s idempotency.Store) keyReleaser {
	t.Helper()
	ops, ok := operator.For[idempotency.Record, idempotency.Fence](s)
	if !ok {
		t.Skipf("%T registers no operator release", s)
	}
	return keyReleaser{ops}
}

// releasable reports whether an operator may release rec: failed, or in
// flight past its lease.
func releasable(rec idempotency.Record) bool {
	return rec.Status == idempotency.StatusFailed || rec.Status == idempotency.StatusInFlight && rec.LeaseOver
}

// releaseTests are runRelease's subtests.
func releaseTests(t *testing.T, setup setupFunc) {
	t.Run("LookupKeyExact", func(t *testing.T) {
		// Opaque keys are compared exactly: AbC and abc are two keys.
		s, ctx := setup(t)
		kr := releaser(t, s)
		for _, k := range []struct{ key, endpoint string }{{"AbC", otherEndpoint}, {"AbC", endpoint}, {"abc", endpoint}} {
			req := newRequest("user-1")
			req.Key, req.Endpoint = k.key, k.endpoint
			MustClaim(t, s, req)
		}
		rows, err := kr.Lookup(ctx, "AbC", "user-1", "")
		recs := rows.Records
		if err != nil || len(recs) != 2 || recs[0].Key != "AbC" || recs[1].Key != "AbC" ||
			recs[0].Endpoint != otherEndpoint || recs[1].Endpoint != endpoint || rows.Now.IsZero() {
			t.Fatalf("Lookup(AbC): %+v, %v; want its two rows ordered by endpoint, and the store's time", rows, err)
		}
		if rows, err := kr.Lookup(ctx, "AbC", "user-1", endpoint); err != nil || len(rows.Records) != 1 || rows.Records[0].Endpoint != endpoint {
			t.Fatalf("Lookup(AbC) on one endpoint: %+v, %v; want its one row", rows, err)
		}
		if rows, err := kr.Lookup(ctx, "AbC", "user-2", ""); err != nil || len(rows.Records) != 0 {
			t.Fatalf("Lookup in another scope: %+v, %v; want none", rows, err)
		}
	})

	t.Run("ReleasesFailedRow", func(t *testing.T) {
		s, ctx := setup(t)
		kr := releaser(t, s)
		req := newRequest("user-1")
		rec := MustClaim(t, s, req)
		if err := s.Fail(ctx, rec.Fence()); err != nil {
			t.Fatal(err)
		}
		rows, err := kr.Lookup(ctx, req.Key, req.Scope, "")
		recs := rows.Records
		if err != nil || len(recs) != 1 || recs[0].Status != idempotency.StatusFailed || !releasable(recs[0]) {
			t.Fatalf("Lookup: %+v, %v; want one releasable failed row", recs, err)
		}
		if ok, err := kr.ReleaseKey(ctx, recs[0].Fence()); err != nil || !ok {
			t.Fatalf("ReleaseKey of a failed row: %v, %v; want true", ok, err)
		}
		if ok, err := kr.ReleaseKey(ctx, recs[0].Fence()); err != nil || ok {
			t.Fatalf("ReleaseKey of a row already released: %v, %v; want false", ok, err)
		}
		MustClaim(t, s, req) // the key is new again
	})

	t.Run("ReleasesStaleInFlightRow", func(t *testing.T) {
		s, ctx := setup(t)
		kr := releaser(t, s)
		req := Request("user-1", longTTL, tiny)
		MustClaim(t, s, req)
		rec := WaitFor(t, s, req, "past its lease", isLeaseOver)
		if ok, err := kr.ReleaseKey(ctx, rec.Fence()); err != nil || !ok {
			t.Fatalf("ReleaseKey of a stale in_flight row: %v, %v; want true", ok, err)
		}
		MustClaim(t, s, req)
	})

	t.Run("RefusesLiveAndCompletedRows", func(t *testing.T) {
		s, ctx := setup(t)
		kr := releaser(t, s)
		live := newRequest("user-1")
		liveRec := MustClaim(t, s, live)
		done := newRequest("user-1")
		doneRec := MustClaim(t, s, done)
		if err := s.Complete(ctx, doneRec.Fence(), doneRec, jsonResponse()); err != nil {
			t.Fatal(err)
		}
		for what, f := range map[string]idempotency.Fence{"live in_flight": liveRec.Fence(), "completed": doneRec.Fence()} {
			if ok, err := kr.ReleaseKey(ctx, f); err != nil || ok {
				t.Errorf("ReleaseKey of a %s row: %v, %v; want false", what, ok, err)
			}
		}
		sameRecord(t, "live row after a refused release", Read(t, s, live), liveRec)
		if rec := Read(t, s, done); rec.Status != idempotency.StatusCompleted {
			t.Errorf("completed row after a refused release: %+v", rec)
		}
	})

	t.Run("Fenced", func(t *testing.T) {
		// A row taken over since it was read is not the row the operator
		// saw: its old fence releases nothing.
		s, ctx := setup(t)
		kr := releaser(t, s)
		req := Request("user-1", tiny, tiny)
		rec := MustClaim(t, s, req)
		if err := s.Fail(ctx, rec.Fence()); err != nil {
			t.Fatal(err)
		}
		read := WaitFor(t, s, req, "expired", isExpired)
		next := req
		next.TTL, next.Lease = longTTL, longLease
		res, err := s.Takeover(ctx, read.Fence(), next)
		if err != nil || !res.Won {
			t.Fatalf("Takeover: won %v, %v", res.Won, err)
		}
		// The new owner fails too: the row is releasable again, but not
		// under the fence the operator read.
		if err := s.Fail(ctx, res.Record.Fence()); err != nil {
			t.Fatal(err)
		}
		if ok, err := kr.ReleaseKey(ctx, read.Fence()); err != nil || ok {
			t.Fatalf("ReleaseKey with the fence read before a takeover: %v, %v; want false", ok, err)
		}
		wrongScope := read.Fence()
		wrongScope.Scope = "user-2"
		if ok, err := kr.ReleaseKey(ctx, wrongScope); err != nil || ok {
			t.Fatalf("ReleaseKey naming another scope: %v, %v; want false", ok, err)
		}
		if ok, err := kr.ReleaseKey(ctx, res.Record.Fence()); err != nil || !ok {
			t.Fatalf("ReleaseKey with the current fence: %v, %v; want true", ok, err)
		}
	})
}
