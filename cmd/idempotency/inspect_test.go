package main

import (
	"bytes"

	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const (
		orders  = "POST /api/trading/orders"
		billing = "POST /api/billing/checkout-sessions"
	)
	key := newKey()
	db.complete(t, key, "42", orders, time.Hour, jsonResp(201, `{"id":7,"secret":"card-4242"}`))
	db.claim(t, key, "42", billing, time.Hour, time.Millisecond)
	db.complete(t, key, "43", orders, time.Hour, jsonResp(201, `{"id":8}`))
	db.waitRows(t, 1, "status = 'in_flight' AND locked_until < now()")
	// The orders row was claimed under a derive key (Config.DeriveKeys).
	if _, err := db.pool.Exec(t.Context(), `UPDATE idempotency_keys SET derive_key_id = 'k2026'
		WHERE idem_key = $1 AND scope_user_id = '42' AND scope_endpoint = $2`, key, orders); err != nil {
		t.Fatal(err)
	}

	// Every endpoint of the key in that scope; the key in quotes and upper
	// case, as a client may send it.
	r := runDB(t, db.dsn, "inspect", "--user", "42", "--key", `"`+strings.ToUpper(key)+`"`)
	wantCode(t, r, exitOK)
	blocks := strings.Split(r.stdout, "\n\n")
	if len(blocks) != 2 {
		t.Fatalf("want 2 rows, got:\n%s", r.stdout)
	}
	billingRow, ordersRow := blocks[0], blocks[1] // sorted by endpoint
	for _, want := range []string{"key        " + key, "endpoint   " + billing, "status     in_flight",
		"response   none recorded", "stale      YES", "expired    no"} {
		if !strings.Contains(billingRow, want) {
			t.Errorf("billing row lacks %q:\n%s", want, billingRow)
		}
	}
	for _, want := range []string{"user       42", "status     completed", "response   201, json body",
		"stale      no\n", "expired    no", "derive key k2026\n"} {
		if !strings.Contains(ordersRow, want) {
			t.Errorf("orders row lacks %q:\n%s", want, ordersRow)
		}
	}
	if strings.Contains(billingRow, "derive key") {
		t.Errorf("billing row, claimed without a derive key, names one:\n%s", billingRow)
	}
	if strings.Contains(r.stdout, "card-4242") || strings.Contains(r.stdout, "application/json") {
		t.Errorf("body or headers shown without --show-body:\n%s", r.stdout)
	}

	// One endpoint, with its body.
	r = runDB(t, db.dsn, "inspect", "--user", "42", "--key", key, "--endpoint", orders, "--show-body")
	wantCode(t, r, exitOK)
	if strings.Contains(r.stdout, billing) || !strings.Contains(r.stdout, "card-4242") ||
		!strings.Contains(r.stdout, "headers    Content-Type: application/json") {
		t.Errorf("inspect --endpoint --show-body:\n%s", r.stdout)
	}

	// JSON.
	r = runDB(t, db.dsn, "inspect", "--json", "--user", "42", "--key", key)
	wantCode(t, r, exitOK)
	var out struct {
		Key, User string
		Rows      []struct {
			Endpoint     string  `json:"endpoint"`
			Status       string  `json:"status"`
			ResponseCode *int    `json:"response_code"`
			Stale        bool    `json:"stale"`
			Expired      bool    `json:"expired"`
			DeriveKeyID  *string `json:"derive_key_id"`
			ResponseBody json.RawMessage
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, r.stdout)
	}
	if out.Key != key || out.User != "42" || len(out.Rows) != 2 ||
		out.Rows[0].Endpoint != billing || !out.Rows[0].Stale || out.Rows[0].ResponseCode != nil ||
		out.Rows[1].Status != "completed" || out.Rows[1].Stale || out.Rows[1].Expired ||
		*out.Rows[1].ResponseCode != 201 || out.Rows[1].ResponseBody != nil ||
		out.Rows[0].DeriveKeyID != nil || out.Rows[1].DeriveKeyID == nil || *out.Rows[1].DeriveKeyID != "k2026" {
		t.Errorf("inspect --json:\n%s", r.stdout)
	}

	// --unscoped is the '' scope: nothing there, exit 1 (it was exit 0
	// with "no row" before #38); --json still prints the empty document.
	r = runDB(t, db.dsn, "inspect", "--unscoped", "--key", key)
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "no key "+key+" in the unscoped ('') scope") {
		t.Errorf("inspect of a missing key printed %q", r.stderr)
	}
	r = runDB(t, db.dsn, "inspect", "--unscoped", "--key", key, "--json")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stdout, `"rows": []`) {
		t.Errorf("inspect --json of a missing key printed %q", r.stdout)
	}
}

func TestInspectExpired(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	key := newKey()
	db.complete(t, key, "", "POST /x", time.Millisecond, rawResp())
	db.waitRows(t, 1, "expires_at < now()")
	r := runDB(t, db.dsn, "inspect", "--key", key, "--show-body")
	wantCode(t, r, exitOK)
	for _, want := range []string{"user       '' (unscoped)", "expired    YES", "response   200, raw body, 5 bytes", `body       "hello"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestInspectStaleVerdict: what a stale row's retry meets depends on the
// row: an ordinary route's answers outcome_unknown; an expired one is a new
// request.
func TestInspectStaleVerdict(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const ep = "POST /api/trading/orders"
	ordinary, orphan := newKey(), newKey()
	db.claim(t, ordinary, "7", ep, time.Hour, time.Millisecond)
	db.claim(t, orphan, "7", ep, time.Millisecond, time.Millisecond)
	db.waitRows(t, 2, "status = 'in_flight' AND locked_until < now()")
	db.waitRows(t, 1, "expires_at < now()")

	for _, c := range []struct{ key, want string }{
		{ordinary, "stale      YES: in flight past its lease; the outcome is unknown (clients get 409 idempotency_outcome_unknown)"},
		{orphan, "stale      YES: in flight past its lease, and expired: a retry is a new request"},
	} {
		r := runDB(t, db.dsn, "inspect", "--user", "7", "--key", c.key)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, c.want+"\n") {
			t.Errorf("inspect %s: want %q in:\n%s", c.key, c.want, r.stdout)
		}
		r = runDB(t, db.dsn, "inspect", "--json", "--user", "7", "--key", c.key)
		wantCode(t, r, exitOK)
		var out struct {
			Rows []struct {
				Stale bool `json:"stale"`
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Rows) != 1 ||
			!out.Rows[0].Stale {
			t.Errorf("inspect --json %s: %v\n%s", c.key, err, r.stdout)
		}
	}
}

// TestInspectJSONStoredRaw: a JSON body jsonb would have refused (a \u0000
// escape, a number beyond numeric's range) is stored byte for byte, as every
// body is; inspect --show-body shows it as export does: the body itself and
// its length.
func TestInspectJSONStoredRaw(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const ep = "POST /api/reports"
	for _, body := range []string{`{"note":"a\u0000b","id":7}`, `{"big":1e400000,"id":8}`} {
		key := newKey()
		db.complete(t, key, "9", ep, time.Hour, jsonResp(200, body))

		r := runDB(t, db.dsn, "inspect", "--user", "9", "--key", key, "--show-body")
		wantCode(t, r, exitOK)
		for _, want := range []string{
			fmt.Sprintf("response   200, json body, %d bytes\n", len(body)),
			"body       " + body + "\n",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("inspect --show-body of %s lacks %q:\n%s", body, want, r.stdout)
			}
		}

		r = runDB(t, db.dsn, "inspect", "--json", "--user", "9", "--key", key, "--show-body")
		wantCode(t, r, exitOK)
		var out struct {
			Rows []struct {
				Kind  string          `json:"response_body_kind"`
				Body  json.RawMessage `json:"response_body"`
				Bytes int64           `json:"response_body_bytes"`
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Rows) != 1 {
			t.Fatalf("inspect --json: %v\n%s", err, r.stdout)
		}
		var got bytes.Buffer
		if err := json.Compact(&got, out.Rows[0].Body); err != nil || got.String() != body ||
			out.Rows[0].Kind != "json" || out.Rows[0].Bytes != int64(len(body)) {
			t.Errorf("inspect --json of %s: kind %q, %d bytes, body %s (%v)",
				body, out.Rows[0].Kind, out.Rows[0].Bytes, out.Rows[0].Body, err)
		}

		// export says the same.
		r = runDB(t, db.dsn, "export", "--user", "9")
		wantCode(t, r, exitOK)
		var exported struct {
			Key  string          `json:"key"`
			Kind string          `json:"response_body_kind"`
			Body json.RawMessage `json:"response_body"`
		}
		found := false
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			if err := json.Unmarshal([]byte(l), &exported); err != nil {
				t.Fatalf("export line %q: %v", l, err)
			}
			if exported.Key == key {
				found = true
				if exported.Kind != "json" || string(exported.Body) != body {
					t.Errorf("export of %s: kind %q, body %s", body, exported.Kind, exported.Body)
				}
			}
		}
		if !found {
			t.Errorf("export lacks key %s:\n%s", key, r.stdout)
		}
	}
}

// TestInspectProbesOpenTransaction: a key in flight inside another
// session's open transaction (a transactional route's handler) has no
// visible row; inspect --endpoint finds it with its probe and names the
// session, and changes nothing: after the owner rolls back, no row exists.
func TestInspectProbesOpenTransaction(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const ep = "POST /api/trading/orders"
	ctx := t.Context()
	owner, err := db.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Release()
	var pid int
	if err := owner.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := newKey()
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, locked_until, expires_at)
		VALUES ($1, '7', $2, 'h', now() + interval '1 minute', now() + interval '1 hour')`, key, ep); err != nil {
		t.Fatal(err)
	}

	r := runDB(t, db.dsn, "inspect", "--user", "7", "--key", key)
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "no key") || !strings.Contains(r.stderr, "--endpoint probes for it") {
		t.Errorf("inspect without --endpoint: %s", r.stderr)
	}
	r = runDB(t, db.dsn, "inspect", "--user", "7", "--key", key, "--endpoint", ep)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "in flight inside an open transaction") || !strings.Contains(r.stdout, "pid "+strconv.Itoa(pid)) {
		t.Errorf("inspect --endpoint: %s, want the owner's pid %d", r.stdout, pid)
	}
	r = runDB(t, db.dsn, "inspect", "--json", "--user", "7", "--key", key, "--endpoint", ep)
	wantCode(t, r, exitOK)
	var out struct {
		Rows            []json.RawMessage `json:"rows"`
		OpenTransaction *struct {
			PID int `json:"pid"`
		} `json:"open_transaction"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Rows) != 0 || out.OpenTransaction == nil || out.OpenTransaction.PID != pid {
		t.Errorf("inspect --json --endpoint: %v\n%s", err, r.stdout)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r = runDB(t, db.dsn, "inspect", "--user", "7", "--key", key, "--endpoint", ep)
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "no key") {
		t.Errorf("inspect after the owner rolled back: %s, want no key (the probe keeps nothing)", r.stderr)
	}
}

// TestInspectOpaqueKeys: --key takes opaque keys, matched exactly (never
// case-folded), bare or as a structured-field string; a UUID typed in
// upper case finds both the lower-case row a UUID route stored and the
// exact row an opaque route stored.
func TestInspectOpaqueKeys(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	const ep = "POST /charges"
	db.complete(t, "1733015354123456789_AbC-_x", "5", ep, time.Hour, rawResp())
	db.complete(t, "1733015354123456789_abc-_x", "5", ep, time.Hour, rawResp())
	db.complete(t, `say "hi"`, "5", ep, time.Hour, rawResp())
	upper := strings.ToUpper(newKey())
	db.complete(t, upper, "5", "POST /opaque", time.Hour, rawResp())
	db.complete(t, strings.ToLower(upper), "5", "POST /uuid", time.Hour, rawResp())
	for _, c := range []struct {
		key  string
		want []string
	}{
		{"1733015354123456789_AbC-_x", []string{"1733015354123456789_AbC-_x"}},
		{`"1733015354123456789_abc-_x"`, []string{"1733015354123456789_abc-_x"}},
		{`"say \"hi\""`, []string{`say "hi"`}},
		{upper, []string{upper, strings.ToLower(upper)}}, // ordered by endpoint: /opaque, /uuid
	} {
		r := runDB(t, db.dsn, "inspect", "--json", "--user", "5", "--key", c.key)
		wantCode(t, r, exitOK)
		var out struct {
			Rows []struct {
				Key string `json:"key"`
			} `json:"rows"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, row := range out.Rows {
			got = append(got, row.Key)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("inspect --key %s: rows %q, want %q", c.key, got, c.want)
		}
	}
}
