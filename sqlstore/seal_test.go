package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// The sealing store over the database/sql store, on both dialects: the
// root's seal tests (seal_harness_test.go, seal_pg*_test.go) cover the
// memory and pgx stores; these cover this one, its raw columns read as
// the dialect stores them.

// sealDialect is one database/sql store under test and its pool.
type sealDialect struct {
	db    *sql.DB
	inner *sqlstore.Store
	pg    bool
}

// q rewrites the ? placeholders of stmt for the dialect.
func (d sealDialect) q(stmt string) string {
	if !d.pg {
		return stmt
	}
	var b strings.Builder
	n := 0
	for _, r := range stmt {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// exec runs stmt on the dialect's pool and fails unless it changed one
// row.
func (d sealDialect) exec(t testing.TB, stmt string, args ...any) {
	t.Helper()
	res, err := d.db.ExecContext(context.Background(), d.q(stmt), args...)
	if err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%s: %d rows, want 1", stmt, n)
	}
}

// count runs a COUNT(*) query.
func (d sealDialect) count(t testing.TB, stmt string, args ...any) int {
	t.Helper()
	var n int
	if err := d.db.QueryRowContext(context.Background(), d.q(stmt), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
	return n
}

// sealDialects runs f on MariaDB and on PostgreSQL through both of its
// drivers, each on a fresh table with an orders table beside it.
func sealDialects(t *testing.T, f func(t *testing.T, d sealDialect)) {
	t.Run("MariaDB", func(t *testing.T) {
		t.Parallel()
		m := newMySQLDB(t)
		db := m.open(t, 4)
		exec(t, db, "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(64) NOT NULL, secret VARCHAR(64) NOT NULL) ENGINE=InnoDB")
		f(t, sealDialect{db: db, inner: m.store(t, 4)})
	})
	for _, driver := range pgDrivers {
		t.Run("PostgreSQL/"+driver, func(t *testing.T) {
			t.Parallel()
			db, _ := pgDB(t, driver, 4)
			exec(t, db, "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL, secret TEXT NOT NULL)")
			f(t, sealDialect{db: db, inner: pgStore(t, db), pg: true})
		})
	}
}

// testSealKeys parses keys of the ids (bytes derived from the id), the
// first active.
func testSealKeys(t testing.TB, ids ...string) idempotency.SealKeys {
	t.Helper()
	var entries []string
	for _, id := range ids {
		entries = append(entries, id+":"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(id[len(id)-1:]), 32)))
	}
	k, err := idempotency.ParseSealKeys(strings.Join(entries, ","))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// failingKeys is a key source whose sealing fails on demand (a KMS that
// is unreachable).
type failingKeys struct {
	idempotency.SealKeys
	failSeal atomic.Bool
}

func (k *failingKeys) ActiveSealKey(ctx context.Context) (string, []byte, error) {
	if k.failSeal.Load() {
		return "", nil, errors.New("kms: connection refused")
	}
	return k.SealKeys.ActiveSealKey(ctx)
}

// sealRig is a middleware over a store with a fail-closed, a fail-open
// and (on a TxStore) a transactional route, one handler counting every
// run.
type sealRig struct {
	closed, open, tx http.Handler
	calls            atomic.Int64
}

// newSealRig builds the rig over store; the handler writes the order of
// a transactional route through sqlstore.TxFromContext.
func newSealRig(t *testing.T, d sealDialect, store idempotency.Store) *sealRig {
	t.Helper()
	rg := &sealRig{}
	mw := newMiddleware(t, store, idempotency.Config{ // quiet: every tampered row logs an ERROR
		Scope: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-User")
		},
	})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := rg.calls.Add(1)
		secret := r.Header.Get("X-Secret")
		if tx, ok := sqlstore.TxFromContext(r.Context()); ok {
			key, _ := idempotency.KeyFromContext(r.Context())
			if _, err := tx.ExecContext(r.Context(), d.q("INSERT INTO orders (idem_key, secret) VALUES (?, ?)"), key, secret); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "handler failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+secret)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d,"amount":"1234.56","payment_session":%q}`, n, secret)
	})
	rg.closed = mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(h)
	rg.open = mw.MustRoute(idempotency.RouteConfig{Name: "orders", FailOpen: true})(h)
	if _, ok := store.(idempotency.TxStore); ok {
		rg.tx = mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(h)
	}
	return rg
}

// sealSend sends user's keyed order through h; the answer carries secret.
func sealSend(h http.Handler, user, key, secret string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`))
	r.Header.Set(idempotency.HeaderKey, key)
	r.Header.Set("X-User", user)
	r.Header.Set("X-Secret", secret)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// newSecret is a marker no two responses share.
func newSecret() string { return "cs_" + strings.ReplaceAll(uuid.NewString(), "-", "") }

// sameAnswer fails unless replay is the replay of first: status, stored
// headers, and JSON body with the replay marker taken out.
func sameAnswer(t testing.TB, what string, first, replay *httptest.ResponseRecorder) {
	t.Helper()
	if replay.Code != first.Code || replay.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("%s: %d %s, want the replay of %d %s", what, replay.Code, replay.Body, first.Code, first.Body)
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
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"idempotency_store_unavailable"`) {
		t.Fatalf("%s: %d %s, want 503 idempotency_store_unavailable", what, w.Code, w.Body)
	}
}

// rawRow returns every column of key's row as the driver hands it over,
// each byte column both as it is and in hex, and its seal_key_id.
func rawRow(t testing.TB, d sealDialect, key string) (text, sealKeyID string) {
	t.Helper()
	rows, err := d.db.QueryContext(context.Background(), d.q("SELECT * FROM idempotency_keys WHERE idem_key = ?"), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	n := 0
	for rows.Next() {
		n++
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if p, ok := v.([]byte); ok {
				fmt.Fprintf(&b, "%s=%s %x\n", cols[i], p, p)
				v = string(p)
			} else {
				fmt.Fprintf(&b, "%s=%v\n", cols[i], v)
			}
			if cols[i] == "seal_key_id" && v != nil {
				sealKeyID = fmt.Sprint(v)
			}
		}
	}
	if err := rows.Err(); err != nil || n != 1 {
		t.Fatalf("key %s: %d rows, %v", key, n, err)
	}
	return b.String(), sealKeyID
}

// TestSealedSQLRoundTrip: on an ordinary and a transactional route, the
// first answer replays equal through the sealing store; no column of the
// row holds the body's marker or the stored headers, as they are or in
// hex; seal_key_id holds the active key id.
func TestSealedSQLRoundTrip(t *testing.T) {
	t.Parallel()
	sealDialects(t, func(t *testing.T, d sealDialect) {
		rg := newSealRig(t, d, sealingOf(t, d.inner, testSealKeys(t, "k2", "k1")))
		for route, h := range map[string]http.Handler{"ordinary": rg.closed, "transactional": rg.tx} {
			key, secret := uuid.NewString(), newSecret()
			first := sealSend(h, "", key, secret)
			if first.Code != http.StatusCreated || !strings.Contains(first.Body.String(), secret) {
				t.Fatalf("%s: first answer %d %s", route, first.Code, first.Body)
			}
			sameAnswer(t, route+" replay", first, sealSend(h, "", key, "other"))
			text, id := rawRow(t, d, key)
			if id != "k2" {
				t.Fatalf("%s: seal_key_id %q, want the active k2\n%s", route, id, text)
			}
			if !strings.Contains(text, key) {
				t.Fatalf("%s: the row's text lacks its own key: the search reads nothing\n%s", route, text)
			}
			for _, s := range []string{secret, "1234.56", "payment_session", "application/json", "/orders/"} {
				for _, form := range []string{s, hex.EncodeToString([]byte(s))} {
					if strings.Contains(text, form) {
						t.Fatalf("%s: the row holds %q (as %q) in plaintext:\n%s", route, s, form, text)
					}
				}
			}
		}
		if n := rg.calls.Load(); n != 2 {
			t.Fatalf("the handler ran %d times, want 2", n)
		}
	})
}

// sealingOf wraps inner in a sealing store with keys.
func sealingOf(t testing.TB, inner idempotency.Store, keys idempotency.SealKeys) idempotency.Store {
	t.Helper()
	s, err := idempotency.NewSealingStore(context.Background(), inner, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSealedSQLTampering: a sealed value copied to another key's row,
// another user's, or a row whose status code changed, a flipped byte,
// another or an unknown key id: each row answers 503 on the fail-closed,
// the fail-open and the transactional route and runs nothing.
func TestSealedSQLTampering(t *testing.T) {
	t.Parallel()
	sealDialects(t, func(t *testing.T, d sealDialect) {
		rg := newSealRig(t, d, sealingOf(t, d.inner, testSealKeys(t, "k1", "k9")))
		plain := newSealRig(t, d, d.inner)
		sealedKey := func(user string) string {
			k := uuid.NewString()
			if w := sealSend(rg.closed, user, k, newSecret()); w.Code != http.StatusCreated {
				t.Fatalf("setup: %d %s", w.Code, w.Body)
			}
			return k
		}
		sealed := func(key string) (raw []byte, id string, code int) {
			if err := d.db.QueryRowContext(t.Context(), d.q("SELECT response_body_raw, seal_key_id, response_code FROM idempotency_keys WHERE idem_key = ?"), key).Scan(&raw, &id, &code); err != nil {
				t.Fatal(err)
			}
			return raw, id, code
		}
		source := sealedKey("")
		raw, id, code := sealed(source)
		copyTo := func(user string) string {
			k := uuid.NewString()
			if w := sealSend(plain.closed, user, k, "x"); w.Code != http.StatusCreated {
				t.Fatalf("setup: %d", w.Code)
			}
			d.exec(t, "UPDATE idempotency_keys SET response_body = NULL, response_headers = NULL, response_body_raw = ?, seal_key_id = ?, response_code = ? WHERE idem_key = ?", raw, id, code, k)
			return k
		}
		type tampered struct{ name, user, key string }
		cases := []tampered{{"copied to another key", "", copyTo("")}, {"copied to another user", "u2", copyTo("u2")}}
		k := sealedKey("u3")
		d.exec(t, "UPDATE idempotency_keys SET response_code = 200 WHERE idem_key = ?", k)
		cases = append(cases, tampered{"status changed", "u3", k})
		k = sealedKey("u4")
		flipped, _, _ := sealed(k)
		flipped[20] ^= 1
		d.exec(t, "UPDATE idempotency_keys SET response_body_raw = ? WHERE idem_key = ?", flipped, k)
		cases = append(cases, tampered{"a byte flipped", "u4", k})
		k = sealedKey("u5")
		d.exec(t, "UPDATE idempotency_keys SET seal_key_id = 'k9' WHERE idem_key = ?", k) // k9 exists, but did not seal it
		cases = append(cases, tampered{"another key id", "u5", k})
		k = sealedKey("u6")
		d.exec(t, "UPDATE idempotency_keys SET seal_key_id = 'k7' WHERE idem_key = ?", k)
		cases = append(cases, tampered{"an unknown key id", "u6", k})

		runs := rg.calls.Load()
		for _, c := range cases {
			for route, h := range map[string]http.Handler{"fail-closed": rg.closed, "fail-open": rg.open, "transactional": rg.tx} {
				wantUnavailable(t, c.name+", "+route, sealSend(h, c.user, c.key, newSecret()))
			}
		}
		if n := rg.calls.Load(); n != runs {
			t.Fatalf("the handler ran %d times on tampered rows", n-runs)
		}
		if n := d.count(t, "SELECT COUNT(*) FROM orders"); n != 0 {
			t.Fatalf("%d orders written on tampered rows", n)
		}
		if w := sealSend(rg.closed, "", source, "s"); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("the untouched source: %d %s", w.Code, w.Body)
		}
	})
}

// TestSealedSQLInterfaces: the sealing store over the database/sql store
// is a TxStore, as the store is, on each dialect, and each reaches the
// inner store (a schema check passes, an export finds the row and opens
// it, the lock-wait budget is the inner store's).
func TestSealedSQLInterfaces(t *testing.T) {
	t.Parallel()
	sealDialects(t, func(t *testing.T, d sealDialect) {
		s := sealingOf(t, d.inner, testSealKeys(t, "k1"))
		if _, ok := s.(idempotency.TxStore); !ok {
			t.Fatal("the sealing store over the database/sql store is no TxStore")
		}
		ctx := t.Context()
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check through the sealing store: %v", err)
		}
		budget := s.(idempotency.TxStore)
		if got, want := budget.TxLockWaitBudget(10*time.Millisecond), d.inner.TxLockWaitBudget(10*time.Millisecond); got != want {
			t.Fatalf("TxLockWaitBudget through the sealing store: %v, the inner store's %v", got, want)
		}
		rg := newSealRig(t, d, s)
		key, secret := uuid.NewString(), newSecret()
		if w := sealSend(rg.closed, "", key, secret); w.Code != http.StatusCreated {
			t.Fatalf("order: %d %s", w.Code, w.Body)
		}
		recs, err := s.ExportScope(ctx, "")
		if err != nil || len(recs) != 1 || recs[0].Key != key || recs[0].Response.SealKeyID != "" || !strings.Contains(string(recs[0].Response.Body), secret) {
			t.Fatalf("export through the sealing store: %+v, %v; want the row, opened", recs, err)
		}
	})
}

// TestSealedSQLTransactional: on a transactional route the sealed record
// commits with the handler's order, through sqlstore.TxFromContext: both
// rows or neither. A handler error rolls the order back and records no
// response; a seal that fails commits neither row, and the retry
// executes once.
func TestSealedSQLTransactional(t *testing.T) {
	t.Parallel()
	sealDialects(t, func(t *testing.T, d sealDialect) {
		keys := &failingKeys{SealKeys: testSealKeys(t, "k1")}
		rg := newSealRig(t, d, sealingOf(t, d.inner, keys))
		orders := func(key string) int {
			return d.count(t, "SELECT COUNT(*) FROM orders WHERE idem_key = ?", key)
		}
		sealedRows := func(key string) int {
			return d.count(t, "SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = ? AND status = 'completed' AND seal_key_id = 'k1'", key)
		}
		keyRows := func(key string) int {
			return d.count(t, "SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = ?", key)
		}

		key := uuid.NewString()
		first := sealSend(rg.tx, "", key, newSecret())
		if first.Code != http.StatusCreated || orders(key) != 1 || sealedRows(key) != 1 {
			t.Fatalf("first answer %d %s: %d orders, %d sealed rows; want 1 and 1", first.Code, first.Body, orders(key), sealedRows(key))
		}
		sameAnswer(t, "transactional replay", first, sealSend(rg.tx, "", key, "s"))
		sameAnswer(t, "replay on an ordinary route", first, sealSend(rg.closed, "", key, "s"))

		failed := uuid.NewString()
		if w := sealSend(rg.tx, "", failed, newSecret(), "X-Fail", "1"); w.Code != http.StatusInternalServerError {
			t.Fatalf("the failing handler: %d %s", w.Code, w.Body)
		}
		if n := orders(failed); n != 0 {
			t.Fatalf("a handler error left %d orders", n)
		}
		if n := d.count(t, "SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = ? AND (seal_key_id IS NOT NULL OR response_body_raw IS NOT NULL OR response_body IS NOT NULL)", failed); n != 0 {
			t.Fatalf("a handler error left %d rows with a response", n)
		}

		keys.failSeal.Store(true)
		lost := uuid.NewString()
		wantUnavailable(t, "the seal failed", sealSend(rg.tx, "", lost, newSecret()))
		if o, k := orders(lost), keyRows(lost); o != 0 || k != 0 {
			t.Fatalf("the failed seal left %d orders and %d key rows, want neither", o, k)
		}
		keys.failSeal.Store(false)
		before := rg.calls.Load()
		retry := sealSend(rg.tx, "", lost, newSecret())
		if retry.Code != http.StatusCreated || retry.Header().Get(idempotency.HeaderReplayed) != "" || orders(lost) != 1 || sealedRows(lost) != 1 {
			t.Fatalf("the retry: %d %s, %d orders, %d sealed rows; want it executed, once", retry.Code, retry.Body, orders(lost), sealedRows(lost))
		}
		sameAnswer(t, "the retry's replay", retry, sealSend(rg.tx, "", lost, "s"))
		if n := rg.calls.Load() - before; n != 1 {
			t.Fatalf("the retry and its replay ran the handler %d times, want once", n)
		}
	})
}
