// Package ormtest is the shared test of the database/sql recipes (sqlc in
// sqlstore; contrib/sqlx, contrib/gorm, contrib/bun): each recipe gives Run
// a handler's write through its ORM on the transactional route's lent
// *sqlstore.Tx, and Run checks the contract on a real database. Success
// commits exactly one row and replays; an error rolls the row back and
// fails the key; Commit and Rollback on what the recipe hands the handler
// are refused, and the key is still owned after them (a duplicate sent
// then is answered 409 in flight and never runs); a write through the
// recipe after the handler returned is refused, and so is the recipe's
// Late read between the handler's return and the route's commit.
package ormtest

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
	"github.com/idemkit/idempotency/sqlstore"
)

// Backend is one database a recipe runs on: a migrated database of the
// test's own with an empty orders table (id, symbol), a pool on it and a
// Store on that pool.
type Backend struct {
	Name       string // "mariadb"
	Dialect    sqlstore.Dialect
	DriverName string // the database/sql driver's name: "mysql"
	DB         *sql.DB
	Store      *sqlstore.Store
}

// Order is the orders table's row, for the recipes' models.
type Order struct {
	ID     int64
	Symbol string
}

// ordersDDL is the orders table per dialect.
var ordersDDL = map[sqlstore.Dialect]string{
	sqlstore.MySQL:      "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, symbol VARCHAR(16) NOT NULL) ENGINE=InnoDB",
	sqlstore.PostgreSQL: "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, symbol TEXT NOT NULL)",
}

// Backends returns a Backend per database the recipes run on: MariaDB/MySQL
// (IDEMPOTENCY_TEST_MYSQL_URL) and PostgreSQL through pgx's stdlib
// (IDEMPOTENCY_TEST_DATABASE_URL, a schema of the test's own with the pgx
// store's table). Without IDEMPOTENCY_TEST_MYSQL_URL the test is skipped
// (a failure under IDEMPOTENCY_REQUIRE_MYSQL=1); without
// IDEMPOTENCY_TEST_DATABASE_URL (and IDEMPOTENCY_REQUIRE_DB) PostgreSQL is
// left out.
func Backends(t *testing.T) []Backend {
	t.Helper()
	d := mysqldb.New(t)
	bs := []Backend{backend(t, "mariadb", sqlstore.MySQL, "mysql", d.Open(t, 4))} // the owner's connection, a duplicate's, the count's
	if os.Getenv("IDEMPOTENCY_TEST_DATABASE_URL") == "" && os.Getenv("IDEMPOTENCY_REQUIRE_DB") == "" {
		t.Log("ormtest: PostgreSQL left out: IDEMPOTENCY_TEST_DATABASE_URL is not set")
		return bs
	}
	pg, err := sql.Open("pgx", testdb.NewDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	pg.SetMaxOpenConns(4)
	return append(bs, backend(t, "postgres", sqlstore.PostgreSQL, "pgx", pg))
}

// backend creates the orders table on db and a Store on it.
func backend(t *testing.T, name string, d sqlstore.Dialect, driver string, db *sql.DB) Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, ordersDDL[d]); err != nil {
		t.Fatalf("ormtest: %s: create orders: %v", name, err)
	}
	s, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatalf("ormtest: %s: sqlstore.New: %v", name, err)
	}
	return Backend{Name: name, Dialect: d, DriverName: driver, DB: db, Store: s}
}

// Recipe is what a recipe's test gives Run.
type Recipe struct {
	// Write inserts one orders row with symbol through the recipe's ORM on
	// the lent transaction of r's route.
	Write func(r *http.Request, symbol string) error
	// EndTx calls Commit and then Rollback on what the recipe hands the
	// handler, and returns their errors (both must be
	// idempotency.ErrTxManaged).
	EndTx func(r *http.Request) (commitErr, rollbackErr error)
	// Late, when set, reads through the recipe on r's route transaction
	// (under a context of its own) after r's handler returned and before
	// the route commits; it must fail: the loan ended with the handler.
	Late func(r *http.Request) error
}

// hookStore is a TxStore whose route transactions run beforeCommit when
// the middleware records (the handler's loan has ended then).
type hookStore struct {
	idempotency.TxStore
	beforeCommit func()
}

func (s hookStore) BeginClaim(ctx context.Context, req *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.ClaimResult, error) {
	t, res, err := s.TxStore.BeginClaim(ctx, req)
	if t != nil {
		t = hookTx{RouteTx: t, beforeCommit: s.beforeCommit}
	}
	return t, res, err
}

type hookTx struct {
	idempotency.RouteTx
	beforeCommit func()
}

func (t hookTx) Commit(ctx context.Context, s *idempotency.Settlement) error {
	if s != nil {
		t.beforeCommit()
	}
	return t.RouteTx.Commit(ctx, s)
}

// failSymbol makes the handler answer 500 after its write.
const failSymbol = "XFAIL"

// lateSymbol is written after the handler returned.
const lateSymbol = "LATE"

// dupHeader marks the request whose handler sends a duplicate.
const dupHeader = "X-Ormtest-Duplicate"

// Run checks rec on b: see the package comment.
func Run(t *testing.T, b Backend, rec Recipe) {
	t.Helper()
	var lateReq atomic.Pointer[http.Request] // a request whose handler returned, for Late at its record
	lateRan := make(chan error, 1)
	store := hookStore{TxStore: b.Store, beforeCommit: func() {
		if r := lateReq.Swap(nil); r != nil {
			lateRan <- rec.Late(r)
		}
	}}
	mw, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	route, err := mw.Route(idempotency.RouteConfig{Transactional: true})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var first atomic.Pointer[http.Request] // the first order's request, for a write after its handler returned
	var h http.Handler
	h = route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if _, ok := sqlstore.TxFromContext(r.Context()); !ok {
			t.Error("no *sqlstore.Tx in the transactional route's context")
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		symbol := string(body)
		if err := rec.Write(r, symbol); err != nil {
			t.Errorf("write through the ORM: %v", err)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if n := count(t, b, symbol); n != 0 {
			t.Errorf("another connection sees %d %s orders before the route commits: the write did not go through the lent transaction", n, symbol)
		}
		if r.Header.Get(dupHeader) != "" && symbol != failSymbol {
			first.Store(r)
		}
		if r.Header.Get(dupHeader) != "" {
			commitErr, rollbackErr := rec.EndTx(r)
			if !errors.Is(commitErr, idempotency.ErrTxManaged) || !errors.Is(rollbackErr, idempotency.ErrTxManaged) {
				t.Errorf("Commit: %v, Rollback: %v; want both idempotency.ErrTxManaged", commitErr, rollbackErr)
			}
			// The key is still this request's: a duplicate now waits
			// TxLockWait for the claim's row and is answered 409 in
			// flight, without running.
			code, dupBody, _ := post(t, h, r.Header.Get("Idempotency-Key"), symbol, false)
			if code != http.StatusConflict || !strings.Contains(dupBody, "idempotency_in_flight") {
				t.Errorf("duplicate after Commit and Rollback: %d %s; want 409 idempotency_in_flight (the key still owned)", code, dupBody)
			}
		}
		if symbol == failSymbol {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"symbol":"`+symbol+`"}`)
		if r.Header.Get(dupHeader) != "" && rec.Late != nil {
			lateReq.Store(r) // read through the recipe once this handler returned, before its record
		}
	}))

	key := uuid.NewString()
	if code, body, _ := post(t, h, key, "AAPL", true); code != http.StatusCreated || !strings.Contains(body, "AAPL") {
		t.Fatalf("first order: %d %s, want 201", code, body)
	}
	code, body, hdr := post(t, h, key, "AAPL", false)
	if code != http.StatusCreated || hdr.Get(idempotency.HeaderReplayed) != "true" || !strings.Contains(body, `"idempotency_replayed":true`) {
		t.Fatalf("retry: %d %s %v, want the replay", code, body, hdr)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times for one key, want 1", n)
	}
	if rec.Late != nil {
		select {
		case err := <-lateRan:
			if err == nil {
				t.Error("a read through the recipe after the handler returned, before the record, succeeded; want it refused")
			}
		default:
			t.Error("Late did not run: the route recorded no settlement")
		}
	}
	if n := count(t, b, "AAPL"); n != 1 {
		t.Fatalf("orders after one key's success and replay: %d, want exactly 1", n)
	}

	// The loan ended with the handler: a write through the recipe on the
	// finished route's transaction is refused and leaves nothing.
	if err := rec.Write(first.Load(), lateSymbol); err == nil {
		t.Error("a write after the handler returned succeeded, want it refused")
	}
	if n := count(t, b, lateSymbol); n != 0 {
		t.Fatalf("orders written after the handler returned: %d, want 0", n)
	}

	failKey := uuid.NewString()
	if code, body, _ := post(t, h, failKey, failSymbol, true); code != http.StatusInternalServerError {
		t.Fatalf("failing order: %d %s, want 500", code, body)
	}
	if n := count(t, b, failSymbol); n != 0 {
		t.Fatalf("orders written by the 500: %d, want 0 (rolled back with the route)", n)
	}
	if code, body, _ := post(t, h, failKey, failSymbol, false); code != http.StatusConflict || !strings.Contains(body, "idempotency_previous_failed") {
		t.Fatalf("retry of the failed key: %d %s, want 409 idempotency_previous_failed", code, body)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times for two keys, want 2", n)
	}
}

// post sends one order with key; dup asks its handler to end the
// transaction and send a duplicate.
func post(t *testing.T, h http.Handler, key, symbol string, dup bool) (int, string, http.Header) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(symbol))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "text/plain")
	if dup {
		r.Header.Set(dupHeader, "1")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b), w.Result().Header
}

// count counts the committed orders of symbol, on a connection of b's
// pool (never the route's).
func count(t *testing.T, b Backend, symbol string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	q := "SELECT COUNT(*) FROM orders WHERE symbol = ?"
	if b.Dialect == sqlstore.PostgreSQL {
		q = "SELECT COUNT(*) FROM orders WHERE symbol = $1"
	}
	if err := b.DB.QueryRowContext(ctx, q, symbol).Scan(&n); err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}
