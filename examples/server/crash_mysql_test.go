package main

import (
	"database/sql"
	"errors"
	"net/http"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
)

// TestCrashMidHandlerMySQL is TestCrashMidHandlerPostgres on MariaDB: a
// server is killed with SIGKILL while two transactional orders are inside
// their handlers. Their claims live in the handlers' InnoDB transactions,
// so MariaDB rolls everything back when the connections go: no row is left
// for either key. A duplicate sent while the owners are mid-handler gets
// 409 in flight within the lock wait's bound. A restarted server executes
// the retries at once, exactly once per key, also when crashStormWorkers
// retries race for one key (no deadlock surfaces as anything but the
// contract's answers); every later retry replays.
func TestCrashMidHandlerMySQL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a binary")
	}
	t.Parallel()
	d := mysqldb.NewEmpty(t)
	db := d.Open(t, 2)
	bin := crashBuildServer(t)
	common := []string{"-addr", "127.0.0.1:0", "-lease", crashLease.String(), "-store-timeout", crashStoreTimeout.String(), "-database-url", d.DSN}

	p1 := crashStart(t, bin, nil, append([]string{"-order-latency", crashSlowLatency.String()}, common...)...)
	uidA, tokA := p1.c.newUser(t)
	uidB, tokB := p1.c.newUser(t)
	keyA, keyB := uuid.NewString(), uuid.NewString()
	bodyA := map[string]any{"symbol": "AAPL", "side": "buy", "qty": 3}
	bodyB := map[string]any{"symbol": "MSFT", "side": "sell", "qty": 5}
	orderA := req{method: "POST", path: "/api/trading/orders", token: tokA, key: keyA, body: bodyA}
	orderB := req{method: "POST", path: "/api/trading/orders", token: tokB, key: keyB, body: bodyB}

	type result struct {
		r   response
		err error
	}
	sent := time.Now()
	originals := make(chan result, 2)
	for _, rq := range []req{orderA, orderB} {
		go func() {
			r, err := p1.c.try(rq)
			originals <- result{r, err}
		}()
	}
	// Wait until both handlers hold their claims: two InnoDB transactions
	// of this database's connections hold rows.
	killBy := sent.Add(crashLease - crashStoreTimeout)
	for !mysqlHeld(t, db, keyA) || !mysqlHeld(t, db, keyB) {
		if time.Now().After(killBy) {
			t.Fatalf("the orders were not in their handlers in time\n%s", p1.logs.String())
		}
		time.Sleep(5 * time.Millisecond) // polling the database, not synchronisation
	}
	if n := mysqlCount(t, db, `SELECT COUNT(*) FROM idempotency_keys WHERE idem_key IN (?, ?)`, keyA, keyB); n != 0 {
		t.Fatalf("%d committed rows for keys whose handlers still run, want none", n)
	}
	// A duplicate mid-handler: 409 in flight, after the bounded wait on the
	// owner's uncommitted row.
	for _, rq := range []req{orderA, orderB} {
		start := time.Now()
		r, _ := p1.send(t, rq)
		expect(t, r, http.StatusConflict, "idempotency_in_flight")
		took := time.Since(start)
		if took > 5*crashStoreTimeout {
			t.Fatalf("a duplicate of an order mid-handler took %v, want well under %v", took, 5*crashStoreTimeout)
		}
		t.Logf("a duplicate of an order mid-handler answered 409 in flight in %v (the request, the claim's %v lock wait included)",
			took.Round(100*time.Microsecond), idempotency.DefaultTxLockWait)
	}

	if err := p1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err := p1.wait(t)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the first server's exit: %v", err)
	}
	for range 2 {
		select {
		case res := <-originals:
			if res.err == nil {
				t.Fatalf("an order in the killed server got an answer: %s", res.r)
			}
		case <-time.After(waitLimit):
			t.Fatal("an order sent to the killed server never returned")
		}
	}
	// MariaDB saw the connections go and rolled their transactions back.
	for deadline := time.Now().Add(waitLimit); mysqlHeld(t, db, keyA) || mysqlHeld(t, db, keyB); {
		if time.Now().After(deadline) {
			t.Fatal("the killed server's claims are still held")
		}
		time.Sleep(5 * time.Millisecond) // polling the database
	}
	t.Logf("the killed server's transactions rolled back %v after the kill", time.Since(killed).Round(time.Millisecond))
	for _, u := range []struct {
		uid int64
		key string
	}{{uidA, keyA}, {uidB, keyB}} {
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM paper_orders WHERE user_id = ?`, u.uid); n != 0 {
			t.Fatalf("user %d has %d orders after the crash, want 0", u.uid, n)
		}
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM audit_log WHERE user_id = ?`, u.uid); n != 0 {
			t.Fatalf("user %d has %d audit rows after the crash, want 0", u.uid, n)
		}
	}

	p2 := crashStart(t, bin, nil, append([]string{"-order-latency", crashFastLatency.String()}, common...)...)
	restarted := time.Now()
	t.Logf("restarted %v after the kill", restarted.Sub(killed).Round(time.Millisecond))
	storm := make([][]result, crashStormWorkers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range crashStormWorkers {
		wg.Go(func() {
			<-start
			deadline := time.Now().Add(waitLimit)
			for {
				r, err := p2.c.try(orderB)
				storm[i] = append(storm[i], result{r, err})
				switch {
				case err != nil:
					return
				case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
					return
				case r.Status != http.StatusConflict && r.Status != http.StatusCreated:
					return
				case time.Now().After(deadline):
					return
				}
				time.Sleep(5 * time.Millisecond) // a client's retry pause
			}
		})
	}
	close(start)
	// Key A: its first retry executes at once, with no lease to wait out.
	executedA, _ := p2.send(t, orderA)
	crashCheckOrder(t, executedA, false, nil, bodyA)
	idA := executedA.Body["id"]
	for range 2 {
		r, _ := p2.send(t, orderA)
		crashCheckOrder(t, r, true, idA, bodyA)
	}
	wg.Wait()
	executedB := 0
	for i, rs := range storm {
		for _, res := range rs {
			switch r := res.r; {
			case res.err != nil:
				t.Fatalf("storm client %d: %v", i, res.err)
			case r.Status == http.StatusConflict && r.Body["error"] == "idempotency_in_flight":
			case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
				executedB++
			case r.Status == http.StatusCreated:
			default:
				t.Fatalf("storm client %d: an answer outside the contract's: %s", i, r)
			}
		}
		if last := rs[len(rs)-1].r; last.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("storm client %d ended without a replay: %s", i, last)
		}
	}
	if executedB != 1 {
		t.Fatalf("key B executed %d times under %d concurrent retries, want once", executedB, crashStormWorkers)
	}
	for _, u := range []struct {
		uid int64
		key string
	}{{uidA, keyA}, {uidB, keyB}} {
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM paper_orders WHERE user_id = ? AND client_order_id = ?`, u.uid, u.key); n != 1 {
			t.Fatalf("user %d has %d orders for its key, want 1", u.uid, n)
		}
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM audit_log WHERE user_id = ? AND action = 'order_placed'`, u.uid); n != 1 {
			t.Fatalf("user %d has %d order_placed audit rows, want 1", u.uid, n)
		}
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = ? AND status = 'completed' AND attempt = 1`, u.key); n != 1 {
			t.Fatalf("key of user %d: %d completed rows of attempt 1, want 1", u.uid, n)
		}
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p2.wait(t); err != nil {
		t.Fatalf("the second server's exit: %v\n%s", err, p2.logs.String())
	}
}

// mysqlHeld reports whether an open transaction holds a row of key: a
// locking read of it that may not wait fails with 1205.
func mysqlHeld(t *testing.T, db *sql.DB, key string) bool {
	t.Helper()
	var n int
	err := db.QueryRowContext(t.Context(), `SET STATEMENT innodb_lock_wait_timeout=0 FOR
		SELECT COUNT(*) FROM idempotency_keys WHERE idem_key = ? LOCK IN SHARE MODE`, key).Scan(&n)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == 1205:
		return true
	case err != nil:
		t.Fatalf("probe of key %s: %v", key, err)
	}
	return false
}

// mysqlCount runs a COUNT query.
func mysqlCount(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}
