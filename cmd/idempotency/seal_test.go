package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// sealKeyEntry is the ID:KEY entry of a test key, its bytes derived from
// the id.
func sealKeyEntry(id string) string {
	return id + ":" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(id[len(id)-1:]), 32))
}

// sealEnv returns the CLI's environment with the keys of ids, the first
// active.
func sealEnv(dsn string, ids ...string) map[string]string {
	var entries []string
	for _, id := range ids {
		entries = append(entries, sealKeyEntry(id))
	}
	return map[string]string{envDatabaseURL: dsn, envSealKeys: strings.Join(entries, ",")}
}

// sealApp is a middleware over the test database sealing with keys (the
// first active), whose handler answers each execution with a body of its
// own and counts the executions of each key.
type sealApp struct {
	h    http.Handler
	runs *keyRuns
}

// keyRuns counts executions per key, shared by the apps of one test.
type keyRuns struct {
	mu sync.Mutex
	n  map[string]int
}

func (k *keyRuns) add(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n[key]++
	return k.n[key]
}

func (k *keyRuns) of(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[key]
}

// newSealApp builds the app; without ids it does not seal.
func newSealApp(t *testing.T, db testDB, runs *keyRuns, ids ...string) *sealApp {
	t.Helper()
	return newSealTxApp(t, db, runs, nil, ids...)
}

// newSealTxApp is newSealApp with a transactional route, when tx is not
// nil, whose handler calls tx first.
func newSealTxApp(t *testing.T, db testDB, runs *keyRuns, tx func(), ids ...string) *sealApp {
	t.Helper()
	var entries []string
	for _, id := range ids {
		entries = append(entries, sealKeyEntry(id))
	}
	var store idempotency.Store = db.store
	if len(ids) > 0 {
		keys, err := idempotency.ParseSealKeys(strings.Join(entries, ","))
		if err != nil {
			t.Fatal(err)
		}
		if store, err = idempotency.NewSealingStore(t.Context(), db.store, keys); err != nil {
			t.Fatal(err)
		}
	}
	mw, err := idempotency.New(store, idempotency.Config{Registerer: prometheus.NewRegistry(),
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: tx != nil})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tx != nil {
			tx()
		}
		key, _ := idempotency.KeyFromContext(r.Context())
		n := runs.add(key)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+key)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q,"execution":%d,"session":%q}`, key, n, uuid.NewString())
	}))
	return &sealApp{h: h, runs: runs}
}

// answer is what a client got, the replay marker taken out of the body.
type answer struct {
	status   int
	location string
	body     string
	replayed bool
}

func (a *sealApp) send(key string) answer {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`))
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, r)
	body := w.Body.String()
	var m map[string]any
	if json.Unmarshal(w.Body.Bytes(), &m) == nil {
		delete(m, "idempotency_replayed")
		b, _ := json.Marshal(m)
		body = string(b)
	}
	return answer{w.Code, w.Header().Get("Location"), body, w.Header().Get(idempotency.HeaderReplayed) == "true"}
}

// normalJSON is b as answer bodies are compared: decoded, re-encoded.
func normalJSON(b []byte) string {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return string(b)
	}
	out, _ := json.Marshal(m)
	return string(out)
}

// resealJSON reads reseal's --json output.
func resealJSON(t *testing.T, r result) resealCounts {
	t.Helper()
	var n resealCounts
	if err := json.Unmarshal([]byte(r.stdout), &n); err != nil {
		t.Fatalf("reseal --json: %v\n%s\n%s", err, r.stdout, r.stderr)
	}
	return n
}

// TestReseal: plaintext rows and rows of an older key are resealed with
// the active key, in batches, and replay as before; a row that does not
// open is reported and left alone (exit 1); a dry run writes nothing; a
// second run reseals nothing; stats counts rows by key id.
func TestReseal(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := t.Context()
	runs := &keyRuns{n: map[string]int{}}
	plain := newSealApp(t, db, runs)
	old := newSealApp(t, db, runs, "k1")
	first := map[string]answer{}
	send := func(a *sealApp, n int) {
		for range n {
			k := uuid.NewString()
			first[k] = a.send(k)
		}
	}
	send(plain, 3)
	send(old, 4)
	db.fail(t, uuid.NewString(), "", "orders", time.Hour)
	db.claim(t, uuid.NewString(), "", "orders", time.Hour, time.Minute)
	lost := uuid.NewString()
	first[lost] = old.send(lost)
	if _, err := db.pool.Exec(ctx, `UPDATE idempotency_keys SET seal_key_id = 'k9' WHERE idem_key = $1`, lost); err != nil {
		t.Fatal(err)
	}
	delete(first, lost)
	snapshot := func() string {
		var s string
		if err := db.pool.QueryRow(ctx, `SELECT string_agg(t::text, E'\n' ORDER BY id) FROM idempotency_keys t`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	before := snapshot()
	dry := runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--dry-run", "--batch", "2", "--json")
	wantCode(t, dry, exitFailure)
	if n := resealJSON(t, dry); n.Read != 8 || n.Resealed != 7 || n.Unopenable != 1 || n.Changed != 0 || !n.DryRun || n.Batches != 4 {
		t.Fatalf("dry run: %+v", n)
	}
	if snapshot() != before {
		t.Fatal("the dry run changed the table")
	}
	if !strings.Contains(dry.stderr, `key id "k9"`) || !strings.Contains(dry.stderr, "1 of the rows read do not open") {
		t.Fatalf("dry run stderr:\n%s", dry.stderr)
	}

	r := runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--batch", "2", "--json")
	wantCode(t, r, exitFailure)
	if n := resealJSON(t, r); n.Read != 8 || n.Resealed != 7 || n.Unopenable != 1 || n.Changed != 0 || n.DryRun {
		t.Fatalf("reseal: %+v\n%s", n, r.stderr)
	}
	retired := newSealApp(t, db, runs, "k2") // k1 retired: every row it sealed is k2's now
	for k, a := range first {
		got := retired.send(k)
		if !got.replayed || got.status != a.status || got.body != a.body || got.location != a.location {
			t.Fatalf("key %s after reseal: %+v, want the replay of %+v", k, got, a)
		}
		if runs.of(k) != 1 {
			t.Fatalf("key %s executed %d times", k, runs.of(k))
		}
	}

	again := runCLI(t, sealEnv(db.dsn, "k2", "k1"), "reseal", "--json")
	t.Logf("a second run, its progress on stderr:\n%s", again.stderr)
	if n := resealJSON(t, again); n.Read != 1 || n.Resealed != 0 || n.Unopenable != 1 {
		t.Fatalf("second run: %+v", n)
	}

	st := runCLI(t, map[string]string{envDatabaseURL: db.dsn}, "stats", "--json")
	wantCode(t, st, exitOK)
	var stats statsJSON
	if err := json.Unmarshal([]byte(st.stdout), &stats); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"k2": 7, "k9": 1}; fmt.Sprint(stats.CompletedBySealKey) != fmt.Sprint(want) {
		t.Fatalf("stats by seal key %v, want %v", stats.CompletedBySealKey, want)
	}
	text := runCLI(t, map[string]string{envDatabaseURL: db.dsn}, "stats")
	if !strings.Contains(text.stdout, "completed, by seal key id") || !regexp.MustCompile(`\n\s+k2\s+7\n`).MatchString(text.stdout) {
		t.Fatalf("stats text:\n%s", text.stdout)
	}
}

// TestSealedExportAndInspect: export and inspect --show-body open what
// they show with the keys given; without them export refuses (exit 1,
// nothing written) and inspect shows the row as sealed, with its key id,
// never its bytes. Malformed keys are a usage error naming the entry by
// position and ID, never its text.
func TestSealedExportAndInspect(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	runs := &keyRuns{n: map[string]int{}}
	key := uuid.NewString()
	want := newSealApp(t, db, runs, "k1").send(key)
	keysEnv := sealEnv(db.dsn, "k1")
	noKeys := map[string]string{envDatabaseURL: db.dsn}

	exp := runCLI(t, keysEnv, "export", "--unscoped")
	wantCode(t, exp, exitOK)
	var rec recordJSON
	if err := json.Unmarshal([]byte(exp.stdout), &rec); err != nil {
		t.Fatalf("export: %v\n%s", err, exp.stdout)
	}
	if rec.Key != key || rec.ResponseBodyKind != "json" || rec.ResponseHeaders.Get("Location") != want.location ||
		normalJSON(rec.ResponseBody) != want.body {
		t.Fatalf("export: %+v, want the response %+v", rec, want)
	}
	exp = runCLI(t, noKeys, "export", "--unscoped")
	wantCode(t, exp, exitFailure)
	if exp.stdout != "" || !strings.Contains(exp.stderr, `sealed with key id "k1"`) || !strings.Contains(exp.stderr, envSealKeys) {
		t.Fatalf("export without the key: stdout %q, stderr %q", exp.stdout, exp.stderr)
	}

	ins := runCLI(t, keysEnv, "inspect", "--key", key, "--show-body")
	wantCode(t, ins, exitOK)
	if !strings.Contains(ins.stdout, want.location) || !strings.Contains(ins.stdout, `"session"`) {
		t.Fatalf("inspect --show-body with the key:\n%s", ins.stdout)
	}
	ins = runCLI(t, noKeys, "inspect", "--key", key, "--show-body", "--json")
	wantCode(t, ins, exitOK)
	var out struct{ Rows []inspectRow }
	if err := json.Unmarshal([]byte(ins.stdout), &out); err != nil || len(out.Rows) != 1 {
		t.Fatalf("inspect --json: %v\n%s", err, ins.stdout)
	}
	if r := out.Rows[0]; r.ResponseBodyKind != "sealed" || r.SealKeyID != "k1" || r.ResponseBody != nil || r.ResponseBodyBase64 != nil || r.ResponseHeaders != nil {
		t.Fatalf("inspect without the key: %+v", r)
	}
	ins = runCLI(t, noKeys, "inspect", "--key", key, "--show-body")
	if !strings.Contains(ins.stdout, "sealed with key id k1, not opened") {
		t.Fatalf("inspect text without the key:\n%s", ins.stdout)
	}

	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for _, c := range []struct{ keys, want string }{
		{"k1:" + secret + ",k2:" + secret[:30], `entry 2 (ID "k2"): the key is not`},
		{secret, "entry 1 has no ':'"},
	} {
		r := runCLI(t, map[string]string{envDatabaseURL: db.dsn, envSealKeys: c.keys}, "export", "--unscoped")
		wantCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, secret[:10]) {
			t.Fatalf("malformed keys: %q, want %q and no key text", r.stderr, c.want)
		}
	}
}

// TestNonceBudgetWarning: stats warns of a key id sealing 2^31 stored
// values or more (one key may seal at most 2^32 with random nonces), and
// of no other.
func TestNonceBudgetWarning(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	c := &cli{stderr: &stderr}
	c.warnNonceBudget(map[string]int64{"k1": 1 << 31, "k2": 1<<31 - 1, "": 1 << 32})
	if got := stderr.String(); strings.Count(got, "warning:") != 1 || !strings.Contains(got, "seal key id k1 seals 2147483648 stored values") {
		t.Fatalf("warnings:\n%s", got)
	}
}
