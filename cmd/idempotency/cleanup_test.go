package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// cleanupPredicate is what cleanup deletes (PostgresStore.Cleanup), for
// waiting until the rows a test made have expired.
const cleanupPredicate = `expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())`

// cleanupFixture makes 6 rows cleanup must delete and 2 it must keep, and
// waits until the short ones have expired.
func cleanupFixture(t *testing.T, db testDB) (liveKey string) {
	t.Helper()
	const ep = "POST /api/trading/orders"
	for range 4 {
		db.complete(t, newKey(), "1", ep, time.Millisecond, jsonResp(201, `{"id":1}`))
	}
	db.fail(t, newKey(), "2", ep, time.Millisecond)
	// An in-flight orphan: expired and its lease over.
	db.claim(t, newKey(), "3", ep, time.Millisecond, time.Millisecond)
	// Expired, but a request still holds it: never deleted.
	liveKey = newKey()
	db.claim(t, liveKey, "4", ep, time.Millisecond, time.Hour)
	// Not expired.
	db.complete(t, newKey(), "5", ep, time.Hour, jsonResp(200, `{}`))

	db.waitRows(t, 7, "expires_at < now()")
	db.waitRows(t, 6, cleanupPredicate)
	return liveKey
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		liveKey := cleanupFixture(t, db)

		r := runDB(t, db.dsn, "cleanup", "--dry-run")
		wantCode(t, r, exitOK)
		if want := "would delete 6 expired rows (dry run: nothing deleted)\n"; r.stdout != want {
			t.Errorf("dry run printed %q, want %q", r.stdout, want)
		}
		if n := db.count(t, "true"); n != 8 {
			t.Fatalf("%d rows after a dry run, want 8", n)
		}

		// Batches of 2: 2, 2, 2, then a short one ends it. --progress 1ns
		// prints a line after every full batch.
		r = runDB(t, db.dsn, "cleanup", "--batch", "2", "--progress", "1ns")
		wantCode(t, r, exitOK)
		if !strings.HasPrefix(r.stdout, "deleted 6 expired rows in 4 batches (") {
			t.Errorf("cleanup printed %q", r.stdout)
		}
		if !strings.Contains(r.stderr, "cleanup: 2 rows deleted so far (1 batches") {
			t.Errorf("no progress line on stderr: %q", r.stderr)
		}
		if n := db.count(t, "true"); n != 2 {
			t.Errorf("%d rows left, want 2", n)
		}
		if n := db.count(t, "idem_key = $1 AND status = 'in_flight'", liveKey); n != 1 {
			t.Error("cleanup deleted an in-flight row whose lease is running")
		}

		r = runDB(t, db.dsn, "cleanup")
		wantCode(t, r, exitOK)
		if !strings.HasPrefix(r.stdout, "deleted 0 expired rows in 1 batch (") {
			t.Errorf("second cleanup printed %q", r.stdout)
		}
	})
}

func TestCleanupJSON(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		cleanupFixture(t, db)

		r := runDB(t, db.dsn, "cleanup", "--dry-run", "--json")
		wantCode(t, r, exitOK)
		var dry struct {
			DryRun      bool  `json:"dry_run"`
			WouldDelete int64 `json:"would_delete"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &dry); err != nil || !dry.DryRun || dry.WouldDelete != 6 {
			t.Errorf("dry run --json = %s (%v)", r.stdout, err)
		}

		r = runDB(t, db.dsn, "--json", "cleanup")
		wantCode(t, r, exitOK)
		var out struct {
			Deleted, Batches int64
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Deleted != 6 || out.Batches != 1 {
			t.Errorf("cleanup --json = %s (%v)", r.stdout, err)
		}
		if n := db.count(t, "true"); n != 2 {
			t.Errorf("%d rows left, want 2", n)
		}
	})
}
