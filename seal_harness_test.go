package idempotency_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The harness of the sealing tests: keys, a sealing rig of routes over one
// store, and the checks of what a client got.

// sealKeyText returns the ID:KEY entry of a test key, its bytes derived
// from the id.
func sealKeyText(id string) string {
	return id + ":" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(id[len(id)-1:]), 32))
}

// sealKeysOf parses keys of the ids, the first active.
func sealKeysOf(t testing.TB, ids ...string) idempotency.SealKeys {
	t.Helper()
	var entries []string
	for _, id := range ids {
		entries = append(entries, sealKeyText(id))
	}
	k, err := idempotency.ParseSealKeys(strings.Join(entries, ","))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sealing wraps inner in a sealing store with keys.
func sealing(t testing.TB, inner idempotency.Store, keys idempotency.SealKeys) idempotency.Store {
	t.Helper()
	s, err := idempotency.NewSealingStore(context.Background(), inner, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// flakyKeys is a key source whose sealing or opening fails on demand, as
// a KMS that is unreachable.
type flakyKeys struct {
	idempotency.SealKeys
	failSeal, failOpen atomic.Bool
}

var errKMS = errors.New("kms: connection refused")

func (k *flakyKeys) ActiveSealKey(ctx context.Context) (string, []byte, error) {
	if k.failSeal.Load() {
		return "", nil, errKMS
	}
	return k.SealKeys.ActiveSealKey(ctx)
}

func (k *flakyKeys) SealKey(ctx context.Context, id string) ([]byte, error) {
	if k.failOpen.Load() {
		return nil, errKMS
	}
	return k.SealKeys.SealKey(ctx, id)
}

// sealRig is a middleware over one store with a fail-closed route, a
// fail-open route and, over a TxStore with a pool, a transactional route
// whose handler writes an order row; one handler counts every run.
type sealRig struct {
	store        idempotency.Store
	closed, open http.Handler
	tx           http.Handler // nil unless the store is transactional
	reg          *prometheus.Registry
	logs         *lockedBuffer
	calls        atomic.Int64
}

// newSealRig builds the rig over store; pool, when not nil, is the
// database of a transactional store, where it creates the orders table
// unless it exists.
func newSealRig(t *testing.T, store idempotency.Store, pool *pgxpool.Pool, cfg idempotency.Config) *sealRig {
	t.Helper()
	rg := &sealRig{store: store, reg: prometheus.NewRegistry(), logs: &lockedBuffer{}}
	cfg.Registerer, cfg.Logger = rg.reg, slog.New(slog.NewJSONHandler(rg.logs, nil))
	cfg.Enabled = func(context.Context) bool { return true }
	cfg.Scope = func(ctx context.Context) string {
		r, _ := idempotency.RequestFromContext(ctx)
		return r.Header.Get("X-User")
	}
	mw := newMiddleware(t, store, cfg)
	rg.closed = mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(rg.handle))
	rg.open = mw.MustRoute(idempotency.RouteConfig{Name: "orders", FailOpen: true})(http.HandlerFunc(rg.handle))
	if _, ok := store.(idempotency.TxStore); ok && pool != nil {
		if _, err := pool.Exec(t.Context(), `CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL, secret TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		rg.tx = mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(rg.handle))
	}
	return rg
}

// handle answers 201 with a body holding the request's X-Secret, which no
// column of the table may show once sealed; on a transactional route it
// writes the order first.
func (rg *sealRig) handle(w http.ResponseWriter, r *http.Request) {
	n := rg.calls.Add(1)
	secret := r.Header.Get("X-Secret")
	if tx, ok := idempotency.TxFromContext(r.Context()); ok {
		key, _ := idempotency.KeyFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO orders (idem_key, secret) VALUES ($1, $2)`, key, secret); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+secret)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"amount":"1234.56","payment_session":%q}`, n, secret)
}

// sealSend sends a keyed order of the unscoped user through h, whose
// answer carries secret.
func sealSend(h http.Handler, key, secret string) *httptest.ResponseRecorder {
	return sealSendAs(h, "", key, secret)
}

// sealSendAs is sealSend for the user scope user.
func sealSendAs(h http.Handler, user, key, secret string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`))
	r.Header.Set(idempotency.HeaderKey, key)
	r.Header.Set("X-User", user)
	r.Header.Set("X-Secret", secret)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// newSecret is a marker no two responses share.
func newSecret() string { return "cs_" + strings.ReplaceAll(uuid.NewString(), "-", "") }

// sameAnswer fails unless replay is the replay of first: its status, its
// stored headers, and its JSON body with the replay marker taken out.
func sameAnswer(t testing.TB, what string, first, replay *httptest.ResponseRecorder) {
	t.Helper()
	if replay.Code != first.Code || replay.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("%s: %d %s %s, want the replay of %d %s", what, replay.Code, replay.Header(), replay.Body, first.Code, first.Body)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if replay.Header().Get(h) != first.Header().Get(h) {
			t.Fatalf("%s: %s %q, want %q", what, h, replay.Header().Get(h), first.Header().Get(h))
		}
	}
	var a, b map[string]any
	if json.Unmarshal(first.Body.Bytes(), &a) != nil || json.Unmarshal(replay.Body.Bytes(), &b) != nil || b["idempotency_replayed"] != true {
		t.Fatalf("%s: bodies %s and %s", what, first.Body, replay.Body)
	}
	delete(b, "idempotency_replayed")
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("%s: replayed %s, first %s", what, replay.Body, first.Body)
	}
}

// wantUnavailable fails unless w is the contract's 503.
func wantUnavailable(t testing.TB, what string, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"idempotency_store_unavailable"`) || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("%s: %d %s, want 503 idempotency_store_unavailable", what, w.Code, w.Body)
	}
}

// errorLogs returns the ERROR records of the rig's log.
func (rg *sealRig) errorLogs(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(rg.logs.String()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if rec["level"] == "ERROR" {
			out = append(out, rec)
		}
	}
	return out
}

// lockedBuffer is a bytes.Buffer for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// sealStores runs f over a memory store and a Postgres one (with its
// pool; nil for memory).
func sealStores(t *testing.T, f func(t *testing.T, inner idempotency.Store, pool *pgxpool.Pool)) {
	t.Run("Memory", func(t *testing.T) { t.Parallel(); f(t, idempotency.NewMemoryStore(), nil) })
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		f(t, idempotency.NewPostgresStore(pool), pool)
	})
}

// readRaw reads the unscoped key's row through a store that does not
// seal: what the table holds.
func readRaw(t testing.TB, inner idempotency.Store, key string) idempotency.Record {
	t.Helper()
	return readRawAs(t, inner, "", key)
}

// readRawAs is readRaw for the user scope user.
func readRawAs(t testing.TB, inner idempotency.Store, user, key string) idempotency.Record {
	t.Helper()
	rows, err := lookupKey(context.Background(), inner, key, user, "orders")
	if err != nil || len(rows) != 1 {
		t.Fatalf("lookup %s: %d rows, %v", key, len(rows), err)
	}
	return rows[0]
}

// lookupKey reads the rows of key in scope on endpoint as s stores them
// (ExportScope: every store has it, and a store that does not seal opens
// nothing).
func lookupKey(ctx context.Context, s idempotency.Store, key, scope, endpoint string) ([]idempotency.Record, error) {
	recs, err := s.ExportScope(ctx, scope)
	var out []idempotency.Record
	for _, rec := range recs {
		if rec.Key == key && rec.Endpoint == endpoint {
			out = append(out, rec)
		}
	}
	return out, err
}
