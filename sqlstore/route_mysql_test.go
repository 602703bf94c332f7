package sqlstore_test

import (
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// orderRoute wraps h in a transactional, fail-closed route over s.
func orderRoute(t testing.TB, s idempotency.Store, h http.HandlerFunc) http.Handler {
	t.Helper()
	route, err := newMiddleware(t, s, idempotency.Config{}).Route(idempotency.RouteConfig{Transactional: true})
	if err != nil {
		t.Fatal(err)
	}
	return route(h)
}

// post sends one request with key.
func post(t testing.TB, h http.Handler, key, body string) (int, string, http.Header) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b), w.Result().Header
}

func countRows(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLTransactionalRoute: the handler writes through the lent *Tx;
// success commits exactly one row and replays; a 500 rolls the write back
// and fails the key; Commit and Rollback on the lent Tx are refused and
// the key stays owned.
func TestMySQLTransactionalRoute(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	db := d.open(t, 4)
	exec(t, db, "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, symbol VARCHAR(16) NOT NULL) ENGINE=InnoDB")
	s := d.store(t, 4)
	runs := 0
	h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx, ok := sqlstore.TxFromContext(r.Context())
		if !ok {
			t.Error("no *sqlstore.Tx in a transactional route's context")
			return
		}
		if err := tx.Commit(); !errors.Is(err, idempotency.ErrTxManaged) {
			t.Errorf("Commit on the lent Tx: %v, want ErrTxManaged", err)
		}
		if err := tx.Rollback(); !errors.Is(err, idempotency.ErrTxManaged) {
			t.Errorf("Rollback on the lent Tx: %v, want ErrTxManaged", err)
		}
		body, _ := io.ReadAll(r.Body)
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES (?)", string(body)); err != nil {
			t.Errorf("insert: %v", err)
		}
		if string(body) == "XFAIL" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"symbol":"`+string(body)+`"}`)
	})
	key := uuid.NewString()
	if code, body, _ := post(t, h, key, "AAPL"); code != http.StatusCreated || !strings.Contains(body, "AAPL") {
		t.Fatalf("first order: %d %s", code, body)
	}
	code, body, hdr := post(t, h, key, "AAPL")
	if code != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" || !strings.Contains(body, `"idempotency_replayed":true`) {
		t.Fatalf("retry: %d %s %v, want the replay", code, body, hdr)
	}
	if runs != 1 || countRows(t, db, "orders") != 1 {
		t.Fatalf("runs %d, orders %d; want 1 and 1", runs, countRows(t, db, "orders"))
	}
	if code, body, _ := post(t, h, key, "MSFT"); code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d %s, want 422", code, body)
	}

	failKey := uuid.NewString()
	if code, _, _ := post(t, h, failKey, "XFAIL"); code != http.StatusInternalServerError {
		t.Fatalf("failing order: %d, want 500", code)
	}
	if n := countRows(t, db, "orders"); n != 1 {
		t.Fatalf("orders after a 500: %d, want 1 (its write rolled back)", n)
	}
	if code, body, _ := post(t, h, failKey, "XFAIL"); code != http.StatusConflict || !strings.Contains(body, "idempotency_previous_failed") {
		t.Fatalf("retry of a failed key: %d %s, want 409 previous_failed", code, body)
	}
	if runs != 2 {
		t.Fatalf("handler ran %d times, want 2", runs)
	}
}

// TestMySQLSessionChangesDoNotOutliveTheRoute: a handler that runs USE
// and SET SESSION sql_mode=” on its transaction (no SET LOCAL on MySQL)
// leaves nothing on the pool: every later claim, on every connection,
// still reaches the store's table with its modes (DESIGN-settled-r3 item 6).
func TestMySQLSessionChangesDoNotOutliveTheRoute(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	other := newMySQLDB(t) // a database with its own idempotency_keys
	s := d.store(t, 1)     // one connection: every request reuses the pool's only slot
	h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlstore.TxFromContext(r.Context())
		for _, stmt := range []string{"USE " + other.name, "SET SESSION sql_mode = ''", "SET SESSION time_zone = '+05:00'"} {
			if _, err := tx.ExecContext(r.Context(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	for range 3 {
		if code, body, _ := post(t, h, uuid.NewString(), "x"); code != http.StatusCreated {
			t.Fatalf("order: %d %s", code, body)
		}
	}
	db := d.open(t, 1)
	if n := countRows(t, db, "idempotency_keys"); n != 3 {
		t.Fatalf("the store's table holds %d keys, want 3", n)
	}
	if n := countRows(t, other.open(t, 1), "idempotency_keys"); n != 0 {
		t.Fatalf("the other database's table holds %d keys, want 0: a claim followed the handler's USE", n)
	}
	// The pool's connection is a fresh one: no USE, the server's modes.
	var current, mode string
	if err := s.DB().QueryRowContext(t.Context(), "SELECT DATABASE(), @@SESSION.sql_mode").Scan(&current, &mode); err != nil {
		t.Fatal(err)
	}
	if current != d.name || mode == "" {
		t.Fatalf("pooled connection after the routes: database %q, sql_mode %q; want %q and the server's modes", current, mode, d.name)
	}
}

// TestMySQLTxLockWaitBudget: on MariaDB the claim's waits are bounded in
// milliseconds (polled), five of them per claim: a route is refused when
// five times its TxLockWait reaches the store timeout, accepted below.
func TestMySQLTxLockWaitBudget(t *testing.T) {
	t.Parallel()
	s := newMySQLDB(t).store(t, 2)
	if got := s.TxLockWaitBudget(10 * time.Millisecond); got != 50*time.Millisecond {
		t.Fatalf("TxLockWaitBudget(10ms) on MariaDB: %v, want 50ms", got)
	}
	mw, err := idempotency.New(s, idempotency.Config{StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mw.Route(idempotency.RouteConfig{Transactional: true, TxLockWait: 399 * time.Millisecond}); err != nil {
		t.Errorf("TxLockWait 399ms under StoreTimeout 2s: %v, want accepted", err)
	}
	if _, err := mw.Route(idempotency.RouteConfig{Transactional: true, TxLockWait: 400 * time.Millisecond}); err == nil {
		t.Error("TxLockWait 400ms under StoreTimeout 2s (2s of waits): accepted, want refused")
	}
}
