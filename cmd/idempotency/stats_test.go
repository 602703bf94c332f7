package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		const ep = "POST /api/trading/orders"

		r := runDB(t, db.dsn, "stats", "--json")
		wantCode(t, r, exitOK)
		var empty statsJSON
		if err := json.Unmarshal([]byte(r.stdout), &empty); err != nil || empty.Total != 0 ||
			empty.OldestInFlightAgeSeconds != nil || empty.OldestExpiredAgeSeconds != nil {
			t.Errorf("stats of an empty table: %s (%v)", r.stdout, err)
		}

		db.complete(t, newKey(), "1", ep, time.Hour, jsonResp(201, `{}`))
		db.complete(t, newKey(), "1", ep, time.Millisecond, rawResp()) // expired
		db.fail(t, newKey(), "2", ep, time.Hour)
		db.claim(t, newKey(), "3", ep, time.Hour, time.Hour)               // live
		db.claim(t, newKey(), "3", ep, time.Hour, time.Millisecond)        // stale
		db.claim(t, newKey(), "4", ep, time.Millisecond, time.Millisecond) // stale and expired: an orphan
		db.waitRows(t, 2, "expires_at < now()")
		db.waitRows(t, 2, "status = 'in_flight' AND locked_until < now()")

		r = runDB(t, db.dsn, "--json", "stats")
		wantCode(t, r, exitOK)
		var s statsJSON
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("stats --json: %v\n%s", err, r.stdout)
		}
		if s.Total != 6 || s.ByStatus.InFlight != 3 || s.ByStatus.Completed != 2 || s.ByStatus.Failed != 1 ||
			s.InFlightPastLease != 2 || s.AwaitingCleanup != 2 ||
			s.OldestInFlightAgeSeconds == nil || *s.OldestInFlightAgeSeconds < 0 ||
			s.OldestExpiredAgeSeconds == nil || *s.OldestExpiredAgeSeconds <= 0 {
			t.Errorf("stats --json:\n%s", r.stdout)
		}

		r = runDB(t, db.dsn, "stats")
		wantCode(t, r, exitOK)
		for _, want := range []string{"keys                          6", "  in_flight                   3",
			"in flight past lease (stale)  2", "expired, awaiting cleanup     2", "past expiry"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("stats lacks %q:\n%s", want, r.stdout)
			}
		}
	})
}
