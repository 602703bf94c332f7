package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/bench/internal/gosrc"
	"github.com/idemkit/idempotency/internal/testdb"
)

// recorder keeps the SQL and arguments of every query while on.
type recorder struct {
	mu  sync.Mutex
	on  bool
	got []pgx.TraceQueryStartData
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.got = append(r.got, d)
	}
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// start records afresh; take returns what was recorded since, and stops.
func (r *recorder) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.got = true, nil
}

func (r *recorder) take() []pgx.TraceQueryStartData {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.on, r.got = false, nil
	return got
}

// TestRouteRunsThePgbenchStatements holds bench/cmd/pgbenchsql's miss.sql
// and hot.sql to what the route really runs: a new key is pgClaimSQL then
// pgCompleteSQL, and nothing else; a replay is pgClaimSQL alone. It checks
// the arguments against pgbenchVars too, so pgbench stores the same rows.
func TestRouteRunsThePgbenchStatements(t *testing.T) {
	rec := &recorder{}
	pool := testdb.New(t, testdb.Tracer(rec), testdb.MaxConns(2))
	h, err := newHandler(context.Background(), pool, slog.New(slog.DiscardHandler), nil, keepSlots)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	consts, err := gosrc.PostgresStatements("../../..")
	if err != nil {
		t.Fatal(err)
	}
	claimSQL, completeSQL := consts["pgClaimSQL"], consts["pgCompleteSQL"]
	if claimSQL == "" || completeSQL == "" {
		t.Fatal("pgClaimSQL or pgCompleteSQL not found in internal/pgsql")
	}
	vars := map[string]string{}
	for _, v := range pgbenchVars {
		name, value, _ := strings.Cut(v, "=")
		vars[name] = value
	}

	key := uuid.NewString()
	post := func() (status int, replayed bool, body string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/noop", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", string(b)
	}
	sqlOf := func(got []pgx.TraceQueryStartData) []string {
		out := make([]string, len(got))
		for i, d := range got {
			out[i] = d.SQL
		}
		return out
	}

	rec.start()
	status, replayed, body := post()
	miss := rec.take()
	if status != http.StatusCreated || replayed || body != answerBody {
		t.Fatalf("new key: %d replayed %v body %q, want a fresh 201 %s", status, replayed, body, answerBody)
	}
	if len(miss) != 2 || unqualified(miss[0].SQL) != claimSQL || unqualified(miss[1].SQL) != completeSQL {
		t.Fatalf("new key ran %d statements, want pgClaimSQL then pgCompleteSQL:\n%s", len(miss), strings.Join(sqlOf(miss), "\n---\n"))
	}
	claim, complete := miss[0].Args, miss[1].Args
	if len(claim) != 9 || claim[7] != "" || claim[8] != time.Duration(0) || claim[1] != vars["scope"] || claim[2] != vars["endpoint"] ||
		claim[4] != 24*time.Hour || claim[5] != 30*time.Second {
		t.Errorf("claim arguments %v: want scope %q, endpoint %q, TTL 24h (pgbench's ttl), lease 30s, no derive key id (''), no grace (0)", claim, vars["scope"], vars["endpoint"])
	}
	if owner, ok := claim[6].(string); !ok || uuid.Validate(owner) != nil {
		t.Errorf("claim's owner token %#v, want a UUID's text (pgbench's :owner)", claim[6])
	}
	if len(complete) != 10 {
		t.Fatalf("complete arguments %v, want 10", complete)
	}
	if complete[9] != vars["endpoint"] {
		t.Errorf("complete's endpoint %#v, want %q (pgbench's :endpoint)", complete[9], vars["endpoint"])
	}
	if complete[7] != nil {
		t.Errorf("complete's seal key id %#v, want NULL (no sealing; pgbench's literal NULL)", complete[7])
	}
	if complete[2] != vars["scope"] || complete[3] != 201 || vars["code"] != "201" {
		t.Errorf("complete's scope and status %v, %v: want %q, 201", complete[2], complete[3], vars["scope"])
	}
	if b, ok := complete[4].([]byte); !ok || string(b) != vars["body"] {
		t.Errorf("complete's body %#v, want %s", complete[4], vars["body"])
	}
	if raw, ok := complete[5].([]byte); !ok || raw != nil {
		t.Errorf("complete's raw body %#v, want NULL (pgbench's literal NULL)", complete[5])
	}
	if hd, ok := complete[6].([]byte); !ok || string(hd) != vars["headers"] {
		t.Errorf("complete's headers %s, want %s", complete[6], vars["headers"])
	}

	rec.start()
	status, replayed, body = post()
	replay := rec.take()
	// The contract marks a replayed JSON object's body (DESIGN.md).
	if status != http.StatusCreated || !replayed || !strings.Contains(body, `"idempotency_replayed":true`) {
		t.Fatalf("same key again: %d replayed %v body %q, want the replay", status, replayed, body)
	}
	if len(replay) != 1 || unqualified(replay[0].SQL) != claimSQL {
		t.Fatalf("replay ran %d statements, want pgClaimSQL alone:\n%s", len(replay), strings.Join(sqlOf(replay), "\n---\n"))
	}
}

// TestSealedRoute: with seal keys (IDEMPOTENCY_SEAL_KEYS's format) the
// route records its answer sealed under the active key's id, with no
// plaintext of the body in what it sends, and replays the answer opened.
func TestSealedRoute(t *testing.T) {
	rec := &recorder{}
	pool := testdb.New(t, testdb.Tracer(rec), testdb.MaxConns(2))
	keys, err := idempotency.ParseSealKeys("k1:" + base64.StdEncoding.EncodeToString(make([]byte, 32)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(context.Background(), pool, slog.New(slog.DiscardHandler), keys, keepSlots)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	key := uuid.NewString()
	post := func() (int, bool, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/noop", strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", string(b)
	}
	rec.start()
	status, replayed, _ := post()
	got := rec.take()
	if status != http.StatusCreated || replayed {
		t.Fatalf("new key: %d replayed %v, want a fresh 201", status, replayed)
	}
	// pgCompleteSQL's parameters: $8 is the seal key id, $9 and $10 the
	// key and endpoint its fence finds the row by.
	var complete []any
	for _, d := range got {
		if len(d.Args) == 10 {
			complete = d.Args
		}
	}
	if complete == nil || complete[7] != "k1" {
		t.Fatalf("complete's arguments %v, want seal key id k1", complete)
	}
	for i, a := range complete {
		if b, ok := a.([]byte); ok && strings.Contains(string(b), `"ok"`) {
			t.Errorf("complete's argument %d holds the plaintext body: %q", i, b)
		}
		if b, ok := a.(json.RawMessage); ok && strings.Contains(string(b), `"ok"`) {
			t.Errorf("complete's argument %d holds the plaintext body: %s", i, b)
		}
	}
	status, replayed, body := post()
	if status != http.StatusCreated || !replayed || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("replay: %d replayed %v body %q, want the opened answer", status, replayed, body)
	}
}

// TestBatchSlots: NOOP_BATCH_SLOTS takes a count from 0 (off) to 64 and
// refuses anything else, naming the variable.
func TestBatchSlots(t *testing.T) {
	for v, want := range map[string]int{"0": 0, "1": 1, "2": 2, "64": 64} {
		if n, err := batchSlots(v); err != nil || n != want {
			t.Errorf("batchSlots(%q) = %d, %v; want %d", v, n, err, want)
		}
	}
	for _, v := range []string{"", "-1", "65", "two", "1.5"} {
		if _, err := batchSlots(v); err == nil || !strings.Contains(err.Error(), envBatchSlots) {
			t.Errorf("batchSlots(%q): error %v, want one naming %s", v, err, envBatchSlots)
		}
	}
}

// TestBatchSlotsRefusedFirst: a bad NOOP_BATCH_SLOTS, or one with -floor,
// stops the server before it connects, so the database is never touched
// (the URL here answers nothing: a connection attempt would fail
// otherwise).
func TestBatchSlotsRefusedFirst(t *testing.T) {
	const nowhere = "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1"
	for _, c := range []struct{ v, floor string }{{"two", ""}, {"-1", ""}, {"1", "internal/pgsql/pgsql.go"}} {
		t.Setenv(envBatchSlots, c.v)
		err := run("127.0.0.1:0", nowhere, "", c.floor)
		if err == nil || !strings.Contains(err.Error(), envBatchSlots) {
			t.Errorf("%s=%q, floor %q: run returned %v, want an error naming %s", envBatchSlots, c.v, c.floor, err, envBatchSlots)
		}
	}
}
