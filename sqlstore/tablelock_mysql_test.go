package sqlstore_test

import (
	"database/sql"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// TestMySQLTableLockIsAnOutage: a table-level lock on the store's table
// (LOCK TABLES ... WRITE from another connection, as a migration's DDL
// holds a metadata lock) during a claim is an outage, 503 within a bound,
// on the ordinary and the transactional route alike, never 409 in flight
// (no owner exists to wait for, DESIGN-settled-r3 item 30); and once the
// lock is gone each key's retry executes at once: nothing the refused
// claims sent is left behind as an in_flight row.
//
// Two sessions: the server's defaults (lock_wait_timeout a day: the store
// timeout ends the wait), and lock_wait_timeout=1 on the store's
// connections, as a DBA sets it for online migrations: the server ends
// the wait with 1205, the code a row's lock wait has too.
func TestMySQLTableLockIsAnOutage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, params string
	}{{"server defaults", ""}, {"lock_wait_timeout=1", "&lock_wait_timeout=1"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testTableLock(t, c.params)
		})
	}
}

func testTableLock(t *testing.T, params string) {
	d := newMySQLDB(t)
	pool, err := sql.Open("mysql", d.dsn+params)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := sqlstore.New(t.Context(), pool, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	mw := newMiddleware(t, s, idempotency.Config{StoreTimeout: 3 * time.Second, Lease: 10 * time.Second})
	var ran atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	})
	routes := map[string]http.Handler{}
	for name, rc := range map[string]idempotency.RouteConfig{"ordinary": {}, "transactional": {Transactional: true}} {
		route, err := mw.Route(rc)
		if err != nil {
			t.Fatal(err)
		}
		routes[name] = route(handler)
	}

	locker, err := d.open(t, 1).Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	if _, err := locker.ExecContext(t.Context(), "LOCK TABLES idempotency_keys WRITE"); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for name, h := range routes {
		keys[name] = uuid.NewString()
		start := time.Now()
		code, body, _ := post(t, h, keys[name], `{}`)
		took := time.Since(start)
		t.Logf("%s claim under LOCK TABLES: %d %s in %v", name, code, strings.TrimSpace(body), took.Round(time.Millisecond))
		if code != http.StatusServiceUnavailable {
			t.Errorf("%s claim under LOCK TABLES: %d %s, want 503 (an outage, not contention)", name, code, body)
		}
		if took > 6*time.Second {
			t.Errorf("%s claim under LOCK TABLES took %v, want it bounded by the store timeout", name, took)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("handlers ran %d times under the table lock, want 0", n)
	}
	if _, err := locker.ExecContext(t.Context(), "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	// Whatever the refused claims left on the server runs now: wait for
	// the server to finish it (the driver gave their connections up, the
	// server had not noticed), then look for what it wrote.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := locker.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID() AND COMMAND = 'Query'`, d.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d statements still running 10s after UNLOCK TABLES", n)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state: there is nothing to wait on
	}
	// An ordinary claim's INSERT the server ran after its client gave up
	// (it had not noticed the closed connection) commits a row the
	// engine frees in the background (giveBackLost, by its owner token):
	// wait for that, bounded.
	var left int
	for {
		if err := locker.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM idempotency_keys").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state: the release runs in the engine's background
	}
	t.Logf("rows the refused claims left: %d", left)
	if left != 0 {
		t.Errorf("the refused claims left %d rows once the lock was gone, want 0: a retry would wait for an owner that does not exist", left)
	}
	for name, h := range routes {
		if code, body, _ := post(t, h, keys[name], `{}`); code != http.StatusCreated {
			t.Errorf("%s retry after UNLOCK TABLES: %d %s, want 201 (executed: no claim of the refused request left behind)", name, code, body)
		}
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("handlers ran %d times after the lock, want 2 (once per key)", n)
	}
}
