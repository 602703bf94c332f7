package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestRelease(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const ep, other = "POST /api/trading/orders", "POST /api/billing/checkout-sessions"
	rows := func(key string) int64 { return db.count(t, "idem_key = $1", key) }

	// A failed key: printed with the warning; nothing happens without --yes.
	failed := newKey()
	db.fail(t, failed, "42", ep, time.Hour)
	r := runDB(t, db.dsn, "release", "--user", "42", "--key", strings.ToUpper(failed))
	wantCode(t, r, exitUsage)
	for _, want := range []string{"key          " + failed, "status       failed", "WARNING: releasing deletes this row", "second execution"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("release without --yes lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "pass --yes") || rows(failed) != 1 {
		t.Fatalf("release without --yes: stderr %q, %d rows left", r.stderr, rows(failed))
	}
	r = runDB(t, db.dsn, "release", "--user", "42", "--key", failed, "--yes")
	wantCode(t, r, exitOK)
	if rows(failed) != 0 || !strings.Contains(r.stdout, "released key "+failed) ||
		!strings.Contains(r.stderr, "idempotency release: key released") || !strings.Contains(r.stderr, "key="+failed) {
		t.Fatalf("release --yes of a failed key: %d rows left\nstdout %s\nstderr %s", rows(failed), r.stdout, r.stderr)
	}
	db.claim(t, failed, "42", ep, time.Hour, time.Minute) // the key is new again

	// A live in-flight key is refused; a stale one is released.
	live, stale := newKey(), newKey()
	db.claim(t, live, "42", ep, time.Hour, time.Hour)
	db.claim(t, stale, "42", ep, time.Hour, time.Millisecond)
	db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
	r = runDB(t, db.dsn, "release", "--user", "42", "--key", live, "--yes")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "a request is running") || rows(live) != 1 {
		t.Fatalf("release of a live key: stderr %q, %d rows", r.stderr, rows(live))
	}
	r = runDB(t, db.dsn, "--json", "release", "--user", "42", "--key", stale, "--yes")
	wantCode(t, r, exitOK)
	var out struct {
		Released bool
		Row      struct{ Key, Status string }
		Warning  string
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || !out.Released || out.Row.Key != stale ||
		out.Row.Status != "in_flight" || !strings.Contains(out.Warning, "second execution") || rows(stale) != 0 {
		t.Fatalf("release --json of a stale key: %v %+v, %d rows\n%s", err, out, rows(stale), r.stdout)
	}

	// A completed key replays: refused.
	done := newKey()
	db.complete(t, done, "42", ep, time.Hour, rawResp())
	r = runDB(t, db.dsn, "release", "--user", "42", "--key", done, "--yes")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "completed") || rows(done) != 1 {
		t.Fatalf("release of a completed key: stderr %q, %d rows", r.stderr, rows(done))
	}

	// Two endpoints: --endpoint picks one. An opaque key is matched exactly.
	opaque := "1733015354123456789_AbC-_x"
	db.fail(t, opaque, "42", ep, time.Hour)
	db.fail(t, opaque, "42", other, time.Hour)
	db.fail(t, strings.ToLower(opaque), "42", ep, time.Hour)
	r = runDB(t, db.dsn, "release", "--user", "42", "--key", opaque, "--yes")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "pick one with --endpoint") {
		t.Fatalf("two endpoints: %q", r.stderr)
	}
	r = runDB(t, db.dsn, "release", "--user", "42", "--key", `"`+opaque+`"`, "--endpoint", other, "--yes")
	wantCode(t, r, exitOK)
	if rows(opaque) != 1 || rows(strings.ToLower(opaque)) != 1 {
		t.Fatalf("release --endpoint: %d rows of %s left (want 1), %d of its lower case (want 1)", rows(opaque), opaque, rows(strings.ToLower(opaque)))
	}

	// No row, or another user's row: nothing to release.
	r = runDB(t, db.dsn, "release", "--user", "43", "--key", done, "--yes")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "nothing to release") {
		t.Fatalf("no row: %q", r.stderr)
	}
}

// TestReleaseFenced: a row that changed between the read and the delete
// (here: finished by its owner) is not released.
func TestReleaseFenced(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := newKey()
	rec := db.claim(t, key, "7", "POST /x", time.Hour, time.Millisecond)
	db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
	d := &database{pool: db.pool}
	recs, _, err := d.lookup(ctx, nil, key, "7", "")
	if err != nil || len(recs) != 1 || !releasable(recs[0]) {
		t.Fatalf("Lookup: %+v, %v", recs, err)
	}
	// The owner completes late, after the operator read the row.
	if err := db.store.Complete(ctx, rec.Fence(), rec, rawResp()); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.releaseKey(ctx, recs[0].Fence()); err != nil || ok {
		t.Fatalf("ReleaseKey of a row completed since it was read: %v, %v; want false", ok, err)
	}
	if db.count(t, "idem_key = $1 AND status = 'completed'", key) != 1 {
		t.Fatal("the completed row was deleted")
	}
}
