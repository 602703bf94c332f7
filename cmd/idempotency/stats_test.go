package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
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

// TestStatsByDeriveKey: stats counts the keys by the derive key id their
// row names (the id a derive key may leave the keyring after), "" for a
// row claimed without derive keys.
func TestStatsByDeriveKey(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		for i, id := range []string{"d1", "d1", "d2", ""} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res, err := db.store.Claim(ctx, idempotency.ClaimRequest{Key: newKey(), Scope: fmt.Sprint(i), Endpoint: "POST /orders",
				RequestHash: strings.Repeat("ab", 32), TTL: time.Hour, Lease: time.Hour, DeriveKeyID: id})
			cancel()
			if err != nil || !res.Won {
				t.Fatalf("claim under %q: won %v, %v", id, res.Won, err)
			}
		}
		r := runDB(t, db.dsn, "stats", "--json")
		wantCode(t, r, exitOK)
		var s statsJSON
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("stats --json: %v\n%s", err, r.stdout)
		}
		if want := map[string]int64{"": 1, "d1": 2, "d2": 1}; fmt.Sprint(s.KeysByDeriveKey) != fmt.Sprint(want) {
			t.Errorf("stats by derive key %v, want %v", s.KeysByDeriveKey, want)
		}
		r = runDB(t, db.dsn, "stats")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "keys, by derive key id") || !regexp.MustCompile(`\n\s+d1\s+2\n`).MatchString(r.stdout) ||
			!regexp.MustCompile(`\n\s+none\s+1\n`).MatchString(r.stdout) {
			t.Errorf("stats text:\n%s", r.stdout)
		}
	})
}
