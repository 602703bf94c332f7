//go:build matrix

package matrix

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"
)

// The deadlock inside the handler (issue #33's first defect: on MariaDB a
// transfer ran twice). An outside session and the handler lock the two
// accounts in opposite order; the handler is the victim (on PostgreSQL the
// outside session's deadlock_timeout is longer; on InnoDB it is the
// lighter transaction). The handler then retries its writes, ignoring the
// errors, and answers 201, as a naive handler would. The contract: 503,
// nothing committed (the retried writes neither: autocommit = 0 and the
// refusing *sqlstore.Tx, settled-r4 item 3), and the retry executes once.
func deadlockFault() *fault {
	return &fault{name: "deadlock in handler", na: both(needsTx, needsDB(naMemoryDB)), run: runDeadlock}
}

func runDeadlock(t *testing.T, c cell) {
	locked, proceed := make(chan struct{}), make(chan struct{})
	transfer := func(ctx context.Context, h *hctx) error {
		if err := h.effect(ctx); err != nil {
			return err
		}
		if err := lentExec(ctx, "UPDATE matrix_acc SET bal = bal - 10 WHERE id = 1"); err != nil {
			return err
		}
		if h.e.started(h.key) == 1 {
			close(locked)
			<-proceed
		}
		return lentExec(ctx, "UPDATE matrix_acc SET bal = bal + 10 WHERE id = 2")
	}
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := transfer(ctx, hc); err != nil && hc.e.started(hc.key) == 1 {
			_ = lentExec(ctx, hc.e.se.q("INSERT INTO matrix_ledger (k, note) VALUES ($1, 'after')"), hc.key)
			_ = lentExec(ctx, "UPDATE matrix_acc SET bal = bal - 10 WHERE id = 1")
			_ = lentExec(ctx, "UPDATE matrix_acc SET bal = bal + 10 WHERE id = 2")
		} else if err != nil {
			return failure(err)
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	e := newEnv(t, c, envOpts{h: h})
	key := newKey()
	ext := e.outside()
	firstDone := make(chan answer, 1)
	go func() { firstDone <- e.send(key) }()
	select {
	case <-locked:
	case a := <-firstDone:
		e.failf("the handler never reached its first lock: %v", a)
		return
	}
	extDone := make(chan error, 1)
	go func() {
		_, err := ext.ExecContext(context.Background(), "UPDATE matrix_acc SET bal = bal + 1 WHERE id = 1 /* ext-"+key+" */")
		extDone <- err
	}()
	// No need to wait for the outside update to block: whichever of the
	// two waits first, the cycle forms, and the victim is the handler
	// (PostgreSQL: its deadlock_timeout of 1 s fires first; InnoDB: the
	// lighter transaction).
	close(proceed)
	first := <-firstDone
	e.expect("the deadlocked call", first, "idempotency_store_unavailable")
	e.within("the deadlocked call", first, 2*time.Second) // PostgreSQL's deadlock_timeout
	select {
	case <-extDone:
	case <-time.After(e.bound()):
		e.failf("the outside session still waits after the call answered")
	}
	_, _ = ext.ExecContext(context.Background(), "ROLLBACK")
	if n := e.afterRows(key); n != 0 {
		e.failf("%d writes the handler retried after the deadlock committed", n)
	}
	e.atMostOnce(key, 0)
	again := e.send(key)
	e.expect("the retry", again, "")
	e.atMostOnce(key, 1)
}

// fiveRows is a derived table of five rows.
const fiveRows = "(SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4)"

// outside opens a session of its own on the cell's database that holds
// account 2 (and, on InnoDB, 50 ledger rows, so it is the heavier
// transaction); it is closed when the cell ends.
func (e *env) outside() *sql.Conn {
	ctx := e.t.Context()
	conn, err := e.se.direct.Conn(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	stmts := []string{"SET deadlock_timeout = '10s'", "BEGIN"}
	if e.c.store.mysql() {
		// 50 rows from constants: information_schema.columns reads every
		// database's tables, and MariaDB refuses it (1684) while another
		// cell's database runs DDL.
		stmts = []string{"START TRANSACTION", "INSERT INTO matrix_ledger (k) SELECT 'ext' FROM " + fiveRows + " a CROSS JOIN " + fiveRows + " b CROSS JOIN (SELECT 0 UNION ALL SELECT 1) c"}
	}
	stmts = append(stmts, "UPDATE matrix_acc SET bal = bal + 1 WHERE id = 2")
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			e.t.Fatalf("outside session: %s: %v", s, err)
		}
	}
	return conn
}
