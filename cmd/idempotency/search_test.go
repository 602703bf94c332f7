package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// exec runs a test's statement on db: pg on PostgreSQL, my on MySQL.
func (db testDB) exec(t *testing.T, pg, my string, args ...any) {
	t.Helper()
	var err error
	if db.sqlDB != nil {
		_, err = db.sqlDB.ExecContext(t.Context(), my, args...)
	} else {
		_, err = db.pool.Exec(t.Context(), pg, args...)
	}
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
}

// age moves a key's times back by two hours: claimed two hours ago, its
// lease over one hour ago.
func (db testDB) age(t *testing.T, key string) {
	t.Helper()
	db.exec(t,
		`UPDATE idempotency_keys SET created_at = now() - interval '2 hours', locked_at = now() - interval '2 hours',
			locked_until = now() - interval '1 hour' WHERE idem_key = $1`,
		`UPDATE idempotency_keys SET created_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, locked_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR,
			locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE idem_key = ?`, key)
}

// jsonLines decodes output of one JSON object per line.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not one JSON object per line: %v\n%s", err, s)
		}
		out = append(out, m)
	}
	return out
}

// TestInspectAcrossScopes: without --user or --unscoped, inspect searches
// every scope (announced on stderr): one match is printed, several are
// listed and refused (exit 2), none is "no key" (exit 1).
func TestInspectAcrossScopes(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		const ep = "POST /api/trading/orders"
		one, two, none := newKey(), newKey(), newKey()
		db.complete(t, one, "42", ep, time.Hour, jsonResp(201, `{"id":7}`))
		db.complete(t, two, "7", ep, time.Hour, rawResp())
		db.fail(t, two, "8", ep, time.Hour)

		r := runDB(t, db.dsn, "inspect", "--key", none)
		wantCode(t, r, exitFailure)
		if !strings.Contains(r.stderr, "no key "+none+" in any scope") || !strings.Contains(r.stderr, "searching every scope") {
			t.Errorf("inspect of a missing key:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}

		r = runDB(t, db.dsn, "inspect", "--key", one)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "user       42") || !strings.Contains(r.stdout, "status     completed") ||
			!strings.Contains(r.stderr, "searching every scope") {
			t.Errorf("inspect of a key in one scope:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}

		r = runDB(t, db.dsn, "inspect", "--key", two)
		wantCode(t, r, exitUsage)
		for _, want := range []string{`"7"`, `"8"`, ep, "completed", "failed"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("candidates lack %q:\n%s", want, r.stdout)
			}
		}
		if !strings.Contains(r.stderr, "2 rows") || !strings.Contains(r.stderr, "--user") {
			t.Errorf("ambiguous inspect: stderr %q", r.stderr)
		}
		r = runDB(t, db.dsn, "inspect", "--json", "--key", two)
		wantCode(t, r, exitUsage)
		var out struct {
			Candidates []struct {
				User, Endpoint, Status string
				CreatedAt              time.Time `json:"created_at"`
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Candidates) != 2 ||
			out.Candidates[0].User != "7" || out.Candidates[1].Status != "failed" || out.Candidates[0].CreatedAt.IsZero() {
			t.Errorf("ambiguous inspect --json: %v\n%s", err, r.stdout)
		}

		// Scoped: no search; another scope's key is no key here.
		r = runDB(t, db.dsn, "inspect", "--user", "8", "--key", two)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "status     failed") || strings.Contains(r.stderr, "searching") {
			t.Errorf("inspect --user:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}
		r = runDB(t, db.dsn, "inspect", "--unscoped", "--key", one)
		wantCode(t, r, exitFailure)
		if !strings.Contains(r.stderr, "no key "+one+" in the unscoped ('') scope") {
			t.Errorf("inspect --unscoped of a user's key: %q", r.stderr)
		}
	})
}

// TestReleaseEachDialect: release works on both databases, in the scope
// named, and needs one (exit 2 without --user or --unscoped).
func TestReleaseEachDialect(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		const ep = "POST /x"
		key := newKey()
		db.fail(t, key, "", ep, time.Hour)
		db.fail(t, key, "42", ep, time.Hour)
		r := runDB(t, db.dsn, "release", "--key", key, "--yes")
		wantCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, "--user ID or --unscoped is required") || db.count(t, "idem_key = $1", key) != 2 {
			t.Fatalf("release without a scope: %q", r.stderr)
		}
		r = runDB(t, db.dsn, "release", "--unscoped", "--key", key, "--yes")
		wantCode(t, r, exitOK)
		if db.count(t, "idem_key = $1 AND scope_user_id = ''", key) != 0 || db.count(t, "idem_key = $1 AND scope_user_id = '42'", key) != 1 {
			t.Fatalf("release --unscoped: %s %s", r.stdout, r.stderr)
		}

		stale, live := newKey(), newKey()
		db.claim(t, stale, "42", ep, time.Hour, time.Hour)
		db.age(t, stale)
		db.claim(t, live, "42", ep, time.Hour, time.Hour)
		r = runDB(t, db.dsn, "release", "--user", "42", "--key", live, "--yes")
		wantCode(t, r, exitFailure)
		r = runDB(t, db.dsn, "release", "--user", "42", "--key", stale, "--yes")
		wantCode(t, r, exitOK)
		if db.count(t, "idem_key = $1", stale) != 0 || db.count(t, "idem_key = $1", live) != 1 {
			t.Fatalf("release of a stale key: %s %s", r.stdout, r.stderr)
		}
	})
}

// TestList: list --stale finds an aged in-flight key and not a live one;
// --failed the failed keys; --counts counts per endpoint and status; all
// as JSON lines with --json, narrowed by --user and --limit.
func TestList(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		const orders, billing = "POST /api/trading/orders", "POST /api/billing/checkout-sessions"
		stale, live, failed, failed2 := newKey(), newKey(), newKey(), newKey()
		db.claim(t, stale, "3", orders, time.Hour*24, time.Hour)
		db.age(t, stale)
		db.claim(t, live, "3", orders, time.Hour, time.Hour)
		db.fail(t, failed, "4", billing, time.Hour)
		db.fail(t, failed2, "5", orders, time.Hour)
		db.complete(t, newKey(), "3", orders, time.Hour, rawResp())

		r := runDB(t, db.dsn, "list", "--stale")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, stale) || strings.Contains(r.stdout, live) || !strings.Contains(r.stdout, orders) ||
			!strings.Contains(r.stdout, "2h0m") || !strings.Contains(r.stderr, "every scope") {
			t.Errorf("list --stale:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}
		lines := jsonLines(t, runDB(t, db.dsn, "list", "--stale", "--json").stdout)
		if len(lines) != 1 || lines[0]["key"] != stale || lines[0]["user"] != "3" || lines[0]["endpoint"] != orders ||
			lines[0]["age_seconds"].(float64) < 7000 || lines[0]["lease_over_seconds"].(float64) < 3500 {
			t.Errorf("list --stale --json: %v", lines)
		}
		r = runDB(t, db.dsn, "list", "--stale", "--user", "4")
		wantCode(t, r, exitOK)
		if strings.Contains(r.stdout, stale) || strings.Contains(r.stderr, "every scope") {
			t.Errorf("list --stale --user 4:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}

		r = runDB(t, db.dsn, "list", "--stale", "--endpoint", billing)
		wantCode(t, r, exitOK)
		if r.stdout != "no stale in-flight keys\n" {
			t.Errorf("list --stale --endpoint %s: %s", billing, r.stdout)
		}
		if lines := jsonLines(t, runDB(t, db.dsn, "list", "--failed", "--json", "--unscoped").stdout); len(lines) != 0 {
			t.Errorf("list --failed --unscoped: %v", lines)
		}

		lines = jsonLines(t, runDB(t, db.dsn, "list", "--failed", "--json").stdout)
		if len(lines) != 2 || lines[0]["endpoint"] != billing || lines[0]["key"] != failed || lines[1]["key"] != failed2 {
			t.Errorf("list --failed --json: %v", lines)
		}
		r = runDB(t, db.dsn, "list", "--failed", "--json", "--limit", "1")
		wantCode(t, r, exitOK)
		if n := len(jsonLines(t, r.stdout)); n != 1 || !strings.Contains(r.stderr, "--limit") {
			t.Errorf("list --failed --limit 1: %d lines, stderr %q", n, r.stderr)
		}

		lines = jsonLines(t, runDB(t, db.dsn, "list", "--counts", "--json").stdout)
		want := map[string]map[string]float64{
			billing: {"in_flight": 0, "stale": 0, "completed": 0, "failed": 1, "total": 1},
			orders:  {"in_flight": 1, "stale": 1, "completed": 1, "failed": 1, "total": 4},
		}
		if len(lines) != 2 {
			t.Fatalf("list --counts --json: %v", lines)
		}
		for _, l := range lines {
			for k, v := range want[l["endpoint"].(string)] {
				if l[k] != v {
					t.Errorf("list --counts: %s %s = %v, want %v (%v)", l["endpoint"], k, l[k], v, l)
				}
			}
		}
		r = runDB(t, db.dsn, "list", "--counts")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, orders) || !strings.Contains(r.stdout, "STALE") {
			t.Errorf("list --counts:\n%s", r.stdout)
		}
	})
}

// TestResealMySQL: reseal on MariaDB seals plaintext and old-key rows with
// the active key; they replay as before with the new key alone; --user
// narrows it to one scope.
func TestResealMySQL(t *testing.T) {
	t.Parallel()
	db := newMySQLTestDB(t)
	runs := &keyRuns{n: map[string]int{}}
	plain := newSealApp(t, db, runs)
	old := newSealApp(t, db, runs, "k1")
	first := map[string]answer{}
	for i := range 5 {
		k := uuid.NewString()
		if i%2 == 0 {
			first[k] = plain.send(k)
		} else {
			first[k] = old.send(k)
		}
	}
	r := runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--user", "42", "--json")
	wantCode(t, r, exitOK)
	if n := resealJSON(t, r); n.Read != 0 {
		t.Fatalf("reseal --user 42: %+v", n)
	}
	r = runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--unscoped", "--batch", "2", "--json")
	wantCode(t, r, exitOK)
	if n := resealJSON(t, r); n.Read != 5 || n.Resealed != 5 || n.Batches != 3 {
		t.Fatalf("reseal: %+v\n%s", n, r.stderr)
	}
	if n := db.count(t, "seal_key_id = 'k2'"); n != 5 {
		t.Fatalf("%d rows sealed with k2, want 5", n)
	}
	retired := newSealApp(t, db, runs, "k2")
	for k, a := range first {
		got := retired.send(k)
		if !got.replayed || got.status != a.status || got.body != a.body || runs.of(k) != 1 {
			t.Fatalf("key %s after reseal: %+v, want the replay of %+v", k, got, a)
		}
	}
	r = runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--json")
	if n := resealJSON(t, r); n.Read != 0 {
		t.Fatalf("second run: %+v", n)
	}
}
