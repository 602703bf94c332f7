package sqlstore_test

import (
	"database/sql"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/sqlstore"
)

// outageRoutes are a fail-closed transactional order route and a fail-open
// ordinary billing route over one store, counting their handlers' runs.
type outageRoutes struct {
	orders, billing http.Handler
	ordersRan       atomic.Int32
	billingRan      atomic.Int32
}

func newOutageRoutes(t *testing.T, s idempotency.Store) *outageRoutes {
	t.Helper()
	mw := newMiddleware(t, s, idempotency.Config{StoreTimeout: 300 * time.Millisecond, Lease: 3 * time.Second})
	o := &outageRoutes{}
	orders, err := mw.Route(idempotency.RouteConfig{Transactional: true})
	if err != nil {
		t.Fatal(err)
	}
	billing, err := mw.Route(idempotency.RouteConfig{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	o.orders = orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.ordersRan.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	o.billing = billing(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.billingRan.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	return o
}

// TestMySQLStoreCut: MariaDB reached through a proxy. Cut (connections
// refused) and black-holed (nothing answered), the fail-closed order route
// answers 503 without running its handler, and the fail-open billing route
// runs its handler without deduplication: its claim failed (connection,
// or a statement sent on a live connection with no reply) and so did the
// outage probe's new connection, the one case a fail-open route bypasses
// on. Every answer comes within a bound.
func TestMySQLStoreCut(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	proxy := tcpproxy.New(t, mysqlAddr(t, d.dsn))
	cfg, _ := mysql.ParseDSN(d.dsn)
	cfg.Addr, cfg.Timeout = proxy.Addr(), time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	s, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	o := newOutageRoutes(t, s)
	if code, _, _ := post(t, o.orders, uuid.NewString(), "x"); code != http.StatusCreated {
		t.Fatalf("order with the store up: %d", code)
	}
	for _, outage := range []struct {
		name  string
		start func()
	}{{"Cut", proxy.Cut}, {"Blackholed", proxy.Blackhole}} {
		// A live connection for each route's claim: it sends its
		// statement into the outage rather than connect into it (a
		// connect into the black hole is a pool wait, asserted below).
		idleConns(t, db, 2)
		outage.start()
		before, beforeBilling := o.ordersRan.Load(), o.billingRan.Load()
		start := time.Now()
		if code, _, _ := post(t, o.billing, uuid.NewString(), "x"); code != http.StatusCreated {
			t.Fatalf("%s: fail-open billing: %d, want the handler's 201 (bypass)", outage.name, code)
		}
		if code, body, _ := post(t, o.orders, uuid.NewString(), "x"); code != http.StatusServiceUnavailable {
			t.Fatalf("%s: fail-closed order: %d %s, want 503", outage.name, code, body)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("%s: the two answers took %v", outage.name, took)
		}
		if o.ordersRan.Load() != before || o.billingRan.Load() != beforeBilling+1 {
			t.Fatalf("%s: orders ran %d times, billing %d, want 0 and 1", outage.name, o.ordersRan.Load()-before, o.billingRan.Load()-beforeBilling)
		}
		proxy.Restore()
	}
	if code, _, _ := post(t, o.orders, uuid.NewString(), "x"); code != http.StatusCreated {
		t.Fatalf("order after the store came back: %d", code)
	}

	// With no live connection left, a claim waits for the pool to connect
	// through the black hole: a pool wait, pool_exhausted, 503 on every
	// policy (DESIGN-settled-r4 item 4), not a bypass.
	idleConns(t, db, 0)
	proxy.Blackhole()
	defer proxy.Restore()
	before := o.billingRan.Load()
	if code, body, _ := post(t, o.billing, uuid.NewString(), "x"); code != http.StatusServiceUnavailable || o.billingRan.Load() != before {
		t.Fatalf("fail-open billing while the pool connects into a black hole: %d %s, ran %d; want 503, not run",
			code, body, o.billingRan.Load()-before)
	}
}

// idleConns leaves exactly n idle connections, live ones, in db's pool.
func idleConns(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	db.SetMaxIdleConns(-1) // closes the idle ones
	db.SetMaxIdleConns(n)
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.PingContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// TestMySQLNoBypassWithoutOutage: a fail-open route does not bypass on a
// saturated pool (every connection in use: the database was never asked)
// nor on a configuration error (a missing table): both are 503, the
// handler not run.
func TestMySQLNoBypassWithoutOutage(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	db := d.open(t, 1)
	s, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	o := newOutageRoutes(t, s)
	held, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := post(t, o.billing, uuid.NewString(), "x"); code != http.StatusServiceUnavailable || o.billingRan.Load() != 0 {
		t.Fatalf("fail-open with a saturated pool: %d, ran %d; want 503, not run", code, o.billingRan.Load())
	}
	_ = held.Close()

	missing, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL, Table: "no_such_table"})
	if err != nil {
		t.Fatal(err)
	}
	o = newOutageRoutes(t, missing)
	if code, _, _ := post(t, o.billing, uuid.NewString(), "x"); code != http.StatusServiceUnavailable || o.billingRan.Load() != 0 {
		t.Fatalf("fail-open on a missing table: %d, ran %d; want 503, not run", code, o.billingRan.Load())
	}
}

// mysqlAddr is the server address of a DSN.
func mysqlAddr(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Addr
}
