package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// The CLI's own reads and release (rows.go) on both dialects: what the
// conformance kit checked of the stores' operator methods before the CLI
// ran its own SQL.

// rowsCtx bounds each test's statements, so a hang fails the test by name.
func rowsCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLookupKeyExact: opaque keys are compared exactly (AbC and abc are
// two keys), rows come ordered by endpoint with the database's clock, and
// an endpoint or another scope narrows them.
func TestLookupKeyExact(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		ctx, d := rowsCtx(t), &database{pool: db.pool, sqlDB: db.sqlDB}
		const ep, other = "POST /b", "POST /a"
		for _, k := range []struct{ key, endpoint string }{{"AbC", other}, {"AbC", ep}, {"abc", ep}} {
			db.claim(t, k.key, "user-1", k.endpoint, time.Hour, time.Minute)
		}
		recs, now, err := d.lookup(ctx, nil, "AbC", "user-1", "")
		if err != nil || len(recs) != 2 || recs[0].Key != "AbC" || recs[1].Key != "AbC" ||
			recs[0].Endpoint != other || recs[1].Endpoint != ep || now.IsZero() {
			t.Fatalf("lookup(AbC): %+v, %v, %v; want its two rows ordered by endpoint, and the clock", recs, now, err)
		}
		if recs[0].Status != idempotency.StatusInFlight || recs[0].LeaseOver || recs[0].Expired || len(recs[0].RequestHash) != 64 {
			t.Errorf("lookup(AbC) row: %+v; want a live in_flight row with its hash", recs[0])
		}
		if recs, _, err := d.lookup(ctx, nil, "AbC", "user-1", ep); err != nil || len(recs) != 1 || recs[0].Endpoint != ep {
			t.Fatalf("lookup(AbC) on one endpoint: %+v, %v; want its one row", recs, err)
		}
		if recs, now, err := d.lookup(ctx, nil, "AbC", "user-2", ""); err != nil || len(recs) != 0 || now.IsZero() {
			t.Fatalf("lookup in another scope: %+v, %v, %v; want none, and the clock", recs, now, err)
		}
		// A row claimed under a derive key names it (inspect shows it).
		if res, err := db.store.Claim(ctx, idempotency.ClaimRequest{Key: "dk", Scope: "user-1", Endpoint: ep,
			RequestHash: strings.Repeat("ab", 32), TTL: time.Hour, Lease: time.Minute, DeriveKeyID: "k9"}); err != nil || !res.Won {
			t.Fatalf("claim under a derive key: %+v, %v", res, err)
		}
		if recs, _, err := d.lookup(ctx, nil, "dk", "user-1", ep); err != nil || len(recs) != 1 || recs[0].DeriveKeyID != "k9" {
			t.Fatalf("lookup of a row claimed under derive key k9: %+v, %v", recs, err)
		}
	})
}

// TestLookupResponse: a completed row's response comes back decoded.
func TestLookupResponse(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		ctx, d := rowsCtx(t), &database{pool: db.pool, sqlDB: db.sqlDB}
		key := newKey()
		db.complete(t, key, "u", "POST /x", time.Hour, jsonResp(201, `{"a":1}`))
		recs, _, err := d.lookup(ctx, nil, key, "u", "")
		if err != nil || len(recs) != 1 || recs[0].Status != idempotency.StatusCompleted ||
			recs[0].Response.Status != 201 || recs[0].Response.BodyKind != idempotency.BodyJSON ||
			string(recs[0].Response.Body) != `{"a":1}` {
			t.Fatalf("lookup of a completed row: %+v, %v", recs, err)
		}
	})
}

// TestReleaseKeyRows: a failed row and a stale in_flight row are released
// once; a live or completed row, a row taken over since it was read, and
// a fence naming another scope release nothing.
func TestReleaseKeyRows(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		ctx, d := rowsCtx(t), &database{pool: db.pool, sqlDB: db.sqlDB}
		failed := newKey()
		db.fail(t, failed, "u", "POST /x", time.Hour)
		recs, _, err := d.lookup(ctx, nil, failed, "u", "")
		if err != nil || len(recs) != 1 || !releasable(recs[0]) {
			t.Fatalf("lookup: %+v, %v; want one releasable failed row", recs, err)
		}
		wrongScope := recs[0].Fence()
		wrongScope.Scope = "v"
		if ok, err := d.releaseKey(ctx, wrongScope); err != nil || ok {
			t.Fatalf("releaseKey naming another scope: %v, %v; want false", ok, err)
		}
		if ok, err := d.releaseKey(ctx, recs[0].Fence()); err != nil || !ok {
			t.Fatalf("releaseKey of a failed row: %v, %v; want true", ok, err)
		}
		if ok, err := d.releaseKey(ctx, recs[0].Fence()); err != nil || ok {
			t.Fatalf("releaseKey of a row already released: %v, %v; want false", ok, err)
		}

		stale := newKey()
		rec := db.claim(t, stale, "u", "POST /x", time.Hour, time.Millisecond)
		db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
		if ok, err := d.releaseKey(ctx, rec.Fence()); err != nil || !ok {
			t.Fatalf("releaseKey of a stale in_flight row: %v, %v; want true", ok, err)
		}

		live := db.claim(t, newKey(), "u", "POST /x", time.Hour, time.Hour)
		done := newKey()
		db.complete(t, done, "u", "POST /x", time.Hour, rawResp())
		doneRecs, _, err := d.lookup(ctx, nil, done, "u", "")
		if err != nil || len(doneRecs) != 1 {
			t.Fatalf("lookup of the completed row: %+v, %v", doneRecs, err)
		}
		for what, f := range map[string]idempotency.Fence{"live in_flight": live.Fence(), "completed": doneRecs[0].Fence()} {
			if ok, err := d.releaseKey(ctx, f); err != nil || ok {
				t.Errorf("releaseKey of a %s row: %v, %v; want false", what, ok, err)
			}
		}
		if n := db.count(t, "idem_key = $1 OR idem_key = $2", live.Key, done); n != 2 {
			t.Errorf("%d rows left of the live and the completed key, want 2", n)
		}

		// A row taken over since it was read is not the row the operator
		// saw: its old fence releases nothing.
		moved := newKey()
		old := db.claim(t, moved, "u", "POST /x", time.Hour, time.Millisecond)
		if err := db.store.Fail(ctx, old.Fence()); err != nil {
			t.Fatal(err)
		}
		next := old.Fence()
		next.Attempt++
		db.exec(t, `UPDATE idempotency_keys SET attempt = attempt + 1 WHERE idem_key = $1`,
			`UPDATE idempotency_keys SET attempt = attempt + 1 WHERE idem_key = ?`, moved)
		if ok, err := d.releaseKey(ctx, old.Fence()); err != nil || ok {
			t.Fatalf("releaseKey with the fence read before a takeover: %v, %v; want false", ok, err)
		}
		if ok, err := d.releaseKey(ctx, next); err != nil || !ok {
			t.Fatalf("releaseKey with the current fence: %v, %v; want true", ok, err)
		}
	})
}

// TestStatsRows: the counts and ages of a table with one row of each kind.
func TestStatsRows(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		ctx, d := rowsCtx(t), &database{pool: db.pool, sqlDB: db.sqlDB}
		if st, err := d.stats(ctx); err != nil || st != (tableStats{}) {
			t.Fatalf("stats of an empty table = %+v, %v", st, err)
		}
		if n, err := d.countCleanup(ctx); err != nil || n != 0 {
			t.Fatalf("countCleanup of an empty table = %d, %v", n, err)
		}
		db.claim(t, newKey(), "u", "POST /x", time.Hour, time.Hour)
		db.claim(t, newKey(), "u", "POST /x", time.Hour, time.Millisecond)
		db.complete(t, newKey(), "u", "POST /x", time.Hour, rawResp())
		db.fail(t, newKey(), "u", "POST /x", time.Millisecond)
		db.waitRows(t, 1, "status = 'failed' AND expires_at < now()")
		db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
		st, err := d.stats(ctx)
		if err != nil || st.Total != 4 || st.InFlight != 2 || st.Completed != 1 || st.Failed != 1 ||
			st.InFlightPastLease != 1 || st.AwaitingCleanup != 1 || st.OldestInFlightAge <= 0 || st.OldestExpiredAge <= 0 {
			t.Fatalf("stats = %+v, %v", st, err)
		}
		if n, err := d.countCleanup(ctx); err != nil || n != 1 {
			t.Fatalf("countCleanup = %d, %v; want the expired failed row", n, err)
		}
	})
}
