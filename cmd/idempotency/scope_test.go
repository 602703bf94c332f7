package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// eraseFixture stores, for user "u1": two completed keys, a failed one, a
// stale in-flight one and a live in-flight one; and one key each for user
// "u2" and the unscoped scope.
func eraseFixture(t *testing.T, db testDB) (liveKey string) {
	t.Helper()
	const ep = "POST /api/trading/orders"
	db.complete(t, newKey(), "u1", ep, time.Hour, jsonResp(201, `{"id":1}`))
	db.complete(t, newKey(), "u1", "POST /api/billing/checkout-sessions", time.Hour, jsonResp(201, `{"id":"cs_1"}`))
	db.fail(t, newKey(), "u1", ep, time.Hour)
	stale := newKey()
	db.claim(t, stale, "u1", ep, time.Hour, time.Millisecond)
	liveKey = newKey()
	db.claim(t, liveKey, "u1", ep, time.Hour, time.Hour)
	db.complete(t, newKey(), "u2", ep, time.Hour, jsonResp(201, `{"id":2}`))
	db.complete(t, newKey(), "", ep, time.Hour, jsonResp(201, `{"id":3}`))
	db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
	return liveKey
}

func TestErase(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		liveKey := eraseFixture(t, db)

		r := runDB(t, db.dsn, "erase", "--user", "u1")
		wantCode(t, r, exitOK)
		if !strings.HasPrefix(r.stdout, "erased 4 rows of user \"u1\"\nSKIPPED 1 in-flight row") {
			t.Errorf("erase printed:\n%s", r.stdout)
		}
		if !strings.Contains(r.stdout, liveKey) || !strings.Contains(r.stdout, "POST /api/trading/orders") {
			t.Errorf("erase does not list the skipped key and endpoint:\n%s", r.stdout)
		}
		if n := db.count(t, "scope_user_id = 'u1'"); n != 1 {
			t.Errorf("%d rows of u1 left, want the live one", n)
		}
		if n := db.count(t, "scope_user_id <> 'u1'"); n != 2 {
			t.Errorf("%d rows of other scopes left, want 2", n)
		}

		// Nothing left to erase but the live key.
		r = runDB(t, db.dsn, "--json", "erase", "--user", "u1")
		wantCode(t, r, exitOK)
		var out struct {
			User    string
			Deleted int64
			Skipped []struct {
				Key, Endpoint string
				LockedUntil   time.Time `json:"locked_until"`
			}
			RetryAfter *time.Time `json:"retry_after"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("erase --json: %v\n%s", err, r.stdout)
		}
		if out.User != "u1" || out.Deleted != 0 || len(out.Skipped) != 1 || out.Skipped[0].Key != liveKey ||
			out.RetryAfter == nil || !out.RetryAfter.Equal(out.Skipped[0].LockedUntil) ||
			time.Until(out.Skipped[0].LockedUntil) < 30*time.Minute {
			t.Errorf("erase --json = %s", r.stdout)
		}

		// The unscoped scope is erased only when asked for explicitly.
		r = runDB(t, db.dsn, "erase", "--unscoped")
		wantCode(t, r, exitOK)
		if r.stdout != "erased 1 row of the unscoped ('') scope\n" {
			t.Errorf("erase --unscoped printed %q", r.stdout)
		}
		if n := db.count(t, "scope_user_id = 'u2'"); n != 1 {
			t.Errorf("erase of '' touched u2")
		}
	})
}

// TestEmptyUserRefused: --user "$USER_ID" with an empty variable must not
// select the unscoped scope: erase would delete every key stored without a
// user. An empty --user is a usage error and touches nothing; the unscoped
// scope takes --unscoped.
func TestEmptyUserRefused(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		eraseFixture(t, db)
		before := db.count(t, "true")
		for _, args := range [][]string{
			{"erase", "--user", ""}, {"erase", "--user="}, {"--json", "erase", "--user", ""}, {"export", "--user", ""},
		} {
			r := runDB(t, db.dsn, args...)
			wantCode(t, r, exitUsage)
			if !strings.Contains(r.stderr, "--user is empty: give a user ID, or --unscoped") || r.stdout != "" {
				t.Errorf("%q: stdout %q, stderr %q", args, r.stdout, r.stderr)
			}
		}
		if n := db.count(t, "scope_user_id = ''"); n != 1 {
			t.Errorf("%d unscoped rows left, want 1: an empty --user erased them", n)
		}
		if n := db.count(t, "true"); n != before {
			t.Errorf("%d rows left of %d", n, before)
		}
	})
}

func TestEraseJSONNothingSkipped(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		r := runDB(t, db.dsn, "erase", "--user=nobody", "--json")
		wantCode(t, r, exitOK)
		want := `{"user":"nobody","deleted":0,"skipped":[],"retry_after":null}`
		var got bytes.Buffer
		if err := json.Compact(&got, []byte(r.stdout)); err != nil || got.String() != want {
			t.Errorf("erase --json = %s, want %s", r.stdout, want)
		}
	})
}

func TestExport(t *testing.T) {
	t.Parallel()
	eachDialect(t, func(t *testing.T, db testDB) {
		const ep = "POST /api/trading/orders"
		jsonKey, rawKey, emptyKey, flightKey := newKey(), newKey(), newKey(), newKey()
		raw := []byte{0x00, 0xff, 'h', 'i', '\n'}
		db.complete(t, jsonKey, "42", ep, time.Hour, idempotency.Response{
			Status: 201, Body: []byte(`{"id": 7, "note": "<b>"}`), BodyKind: idempotency.BodyJSON,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/api/trading/orders/7"}},
		})
		db.complete(t, rawKey, "42", ep, time.Hour, idempotency.Response{
			Status: 200, Body: raw, BodyKind: idempotency.BodyRaw,
			Header: http.Header{"Content-Type": {"application/octet-stream"}},
		})
		db.complete(t, emptyKey, "42", ep, time.Hour, idempotency.Response{Status: 204, BodyKind: idempotency.BodyRaw})
		db.claim(t, flightKey, "42", ep, time.Hour, time.Hour)
		db.complete(t, newKey(), "43", ep, time.Hour, jsonResp(201, `{"id":8}`))

		r := runDB(t, db.dsn, "export", "--user", "42")
		wantCode(t, r, exitOK)
		if r.stderr != "exported 4 rows of user \"42\"\n" {
			t.Errorf("stderr %q", r.stderr)
		}
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 4 {
			t.Fatalf("%d lines, want 4:\n%s", len(lines), r.stdout)
		}
		byKey := map[string]map[string]any{}
		for _, l := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			byKey[m["key"].(string)] = m
			for _, f := range []string{"created_at", "locked_at", "locked_until", "expires_at"} {
				if _, err := time.Parse(time.RFC3339, m[f].(string)); err != nil {
					t.Errorf("%s %q is not RFC 3339: %v", f, m[f], err)
				}
			}
			if m["user"] != "42" || m["endpoint"] != ep {
				t.Errorf("line %s: wrong user or endpoint", l)
			}
		}

		j := byKey[jsonKey]
		if body, ok := j["response_body"].(map[string]any); !ok || body["id"] != 7.0 || body["note"] != "<b>" {
			t.Errorf("JSON body exported as %v", j["response_body"])
		}
		if j["response_code"] != 201.0 || j["status"] != "completed" || j["response_body_kind"] != "json" {
			t.Errorf("JSON row: %v", j)
		}
		if h, ok := j["response_headers"].(map[string]any); !ok || h["Location"].([]any)[0] != "/api/trading/orders/7" {
			t.Errorf("headers exported as %v", j["response_headers"])
		}
		if _, ok := j["response_body_base64"]; ok {
			t.Error("a JSON body has a response_body_base64 field too")
		}

		rw := byKey[rawKey]
		got, err := base64.StdEncoding.DecodeString(rw["response_body_base64"].(string))
		if err != nil || !bytes.Equal(got, raw) || rw["response_body_kind"] != "raw" {
			t.Errorf("raw body exported as %v (%v)", rw["response_body_base64"], err)
		}
		if _, ok := rw["response_body"]; ok {
			t.Error("a raw body has a response_body field too")
		}
		if e := byKey[emptyKey]; e["response_body_base64"] != "" || e["response_code"] != 204.0 {
			t.Errorf("empty body exported as %v", e)
		}
		f := byKey[flightKey]
		if f["status"] != "in_flight" || f["response_code"] != nil || f["response_body_kind"] != "none" {
			t.Errorf("in-flight row exported as %v", f)
		}

		// --json changes nothing; the unscoped scope needs --unscoped.
		r2 := runDB(t, db.dsn, "export", "--user", "42", "--json")
		wantCode(t, r2, exitOK)
		if r2.stdout != r.stdout {
			t.Errorf("export --json differs from export")
		}
		r = runDB(t, db.dsn, "export", "--unscoped")
		wantCode(t, r, exitOK)
		if r.stdout != "" || !strings.Contains(r.stderr, "exported 0 rows of the unscoped ('') scope") {
			t.Errorf("export --unscoped = %q, %q", r.stdout, r.stderr)
		}
	})
}
