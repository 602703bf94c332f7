//go:build matrix

package matrix

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// Table locks held outside the route ("A bypass needs a dial that
// failed"): the claim waits, and a lock wait is 503 on every policy,
// never a bypass nor 409; the handler does not run; once the lock is gone
// the retry executes once.

func lockFaults() []*fault {
	pgOnly := func(c column) string {
		if c.store.mysql() {
			return naNotPG
		}
		return ""
	}
	myOnly := func(c column) string {
		if !c.store.mysql() {
			return naNotMySQL
		}
		return ""
	}
	db := needsDB(naMemoryDB)
	return []*fault{
		tableLock("LOCK TABLE (PG)", both(db, pgOnly), false, func(e *env, s *sql.Conn) func() {
			e.outsideExec(s, "BEGIN", "LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
			return func() { e.outsideExec(s, "ROLLBACK") }
		}),
		tableLock("LOCK TABLES (MySQL)", both(db, myOnly), false, func(e *env, s *sql.Conn) func() {
			e.outsideExec(s, "LOCK TABLES idempotency_keys WRITE")
			return func() { e.outsideExec(s, "UNLOCK TABLES") }
		}),
		tableLock("FLUSH TABLES WITH READ LOCK", both(db, myOnly), true, func(e *env, s *sql.Conn) func() {
			e.outsideExec(s, "FLUSH TABLES WITH READ LOCK")
			return func() { e.outsideExec(s, "UNLOCK TABLES") }
		}),
		tableLock("DDL waits (MySQL)", both(db, myOnly), false, pendingDDL),
	}
}

// tableLock makes a fault that holds a lock with hold (which returns its
// release) around a call. global: the lock is the server's (FLUSH TABLES
// WITH READ LOCK), so the cell runs alone among the MariaDB cells.
func tableLock(name string, na func(column) string, global bool, hold func(*env, *sql.Conn) func()) *fault {
	return &fault{name: name, na: na, global: global, run: func(t *testing.T, c cell) {
		e := newEnv(t, c, envOpts{})
		s := e.session()
		release := hold(e, s)
		key := newKey()
		a := e.send(key)
		release()
		e.expect("call behind the lock", a, "idempotency_store_unavailable")
		e.within("call behind the lock", a, 0)
		if n := e.started(key); n != 0 {
			e.failf("the handler ran %d times behind the lock", n)
		}
		e.noBypass()
		again := e.retryBusy(key)
		e.expect("retry after the lock", again, "")
		e.atMostOnce(key, 1)
	}}
}

// retryBusy sends key as a client that honours Retry-After would: again
// after 1 s while the answer is 503 or 409 in flight (a claim the server
// ran after the client gave up stays in flight until the engine's
// background release removes it), at most 4 times.
func (e *env) retryBusy(key string) answer {
	var a answer
	for range 4 {
		a = e.send(key)
		if a.code != "idempotency_store_unavailable" && a.code != "idempotency_in_flight" {
			return a
		}
		time.Sleep(time.Second) // the contract's Retry-After: 1, not a synchronisation
	}
	return a
}

// session is a connection of its own to the cell's database, past the
// proxy, closed when the cell ends.
func (e *env) session() *sql.Conn {
	conn, err := e.se.direct.Conn(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// outsideExec runs statements on s, failing the cell on an error.
func (e *env) outsideExec(s *sql.Conn, stmts ...string) {
	for _, q := range stmts {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.ExecContext(ctx, q)
		cancel()
		if err != nil {
			e.t.Fatalf("outside session: %s: %v", q, err)
		}
	}
}

// pendingDDL: one session reads the table in an open transaction, another
// runs an ALTER TABLE that waits for it; every later statement on the
// table queues behind the ALTER.
func pendingDDL(e *env, reader *sql.Conn) func() {
	e.outsideExec(reader, "START TRANSACTION", "SELECT count(*) FROM idempotency_keys")
	alter := e.session()
	done := make(chan error, 1)
	go func() {
		_, err := alter.ExecContext(context.Background(), "ALTER TABLE idempotency_keys COMMENT = 'matrix-ddl'")
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := e.se.direct.QueryRowContext(e.t.Context(),
			"SELECT count(*) FROM information_schema.processlist WHERE state LIKE '%metadata lock%' AND info LIKE '%matrix-ddl%' AND db = DATABASE()").Scan(&n)
		if err != nil {
			e.t.Fatalf("processlist: %v", err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the ALTER TABLE never waited for its metadata lock")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's view: there is no event to wait on
	}
	return func() {
		e.outsideExec(reader, "ROLLBACK")
		select {
		case err := <-done:
			if err != nil {
				e.failf("ALTER TABLE: %v", err)
			}
		case <-time.After(10 * time.Second):
			e.failf("the ALTER TABLE did not finish after its reader ended")
		}
	}
}
