//go:build matrix

package matrix

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// Faults inside a transactional handler: it ends the transaction itself,
// leaves rows unscanned, or changes its session. The contract ("A
// transactional answer follows its commit", settled-r4 items 2 and 3;
// "Session state stays in the route"): the handler's answer only after the
// commit that carries its record; after an end under the handler, 503
// idempotency_store_unavailable and nothing it ran afterwards committed.

func txFaults() []*fault {
	dbTx := both(needsTx, needsDB(naMemoryDB))
	return []*fault{
		endsTx("handler runs COMMIT", "COMMIT", "idempotency_outcome_unknown", 1),
		endsTx("handler runs ROLLBACK", "ROLLBACK", "", 1),
		simple("row left unscanned", dbTx, envOpts{h: firstOnly(func(ctx context.Context, h *hctx) error {
			return lentUnscanned(ctx, "SELECT 1")
		})}, answersOnce),
		simple("QueryRow Err, no scan", dbTx, envOpts{h: firstOnly(func(ctx context.Context, h *hctx) error {
			return lentRowErr(ctx, "SELECT 1")
		})}, answersOnce),
		sessionFault("SET ROLE", "SET ROLE matrix_low", "SET ROLE NONE"),
		sessionFault("SET LOCAL ROLE", "SET LOCAL ROLE matrix_low", ""),
		sessionFault("SET search_path", "SET search_path = pg_catalog", ""),
		sessionFault("SET synchronous_commit", "SET synchronous_commit = off", ""),
	}
}

// firstOnly is a behaviour that makes its effect, then runs fault on the
// key's first run only, and answers 201 whatever the fault returned (as a
// handler that ignores the error would).
func firstOnly(fault func(ctx context.Context, h *hctx) error) behaviour {
	return func(ctx context.Context, h *hctx) (int, []byte) {
		if err := h.effect(ctx); err != nil {
			return failure(err)
		}
		if h.e.started(h.key) == 1 {
			_ = fault(ctx, h)
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, h.key)
	}
}

// answersOnce: a fault the engine must absorb: the handler's 201, a replay
// on the retry, one committed effect.
func answersOnce(e *env) {
	key := newKey()
	first := e.send(key)
	e.expect("first call", first, "")
	e.within("first call", first, 0)
	again := e.send(key)
	e.expect("retry", again, "")
	if again.handler && !again.replayed {
		e.failf("retry: ran again (want a replay): %v", again)
	}
	e.within("retry", again, 0)
	e.atMostOnce(key, 1)
	e.noBypass()
}

// endsTx: the handler makes its effect, ends the transaction with stmt,
// makes another effect (which must not commit), and answers 201. The
// client gets 503; the retry gets retryWant ("" executes), and the key's
// committed effects are want.
func endsTx(name, stmt, retryWant string, want int) *fault {
	return &fault{name: name, na: both(needsTx, needsDB(naMemoryDB)), run: func(t *testing.T, c cell) {
		runEndsTx(t, c, stmt, retryWant, want)
	}}
}

func runEndsTx(t *testing.T, c cell, stmt, retryWant string, want int) {
	after := make(chan error, 1)
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := hc.effect(ctx); err != nil {
			return failure(err)
		}
		if hc.e.started(hc.key) == 1 {
			_ = lentExec(ctx, stmt)
			after <- lentExec(ctx, hc.e.se.q("INSERT INTO matrix_ledger (k, note) VALUES ($1, 'after')"), hc.key)
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	e := newEnv(t, c, envOpts{h: h})
	key := newKey()
	first := e.send(key)
	e.expect("first call", first, "idempotency_store_unavailable")
	e.within("first call", first, 0)
	select {
	case err := <-after:
		if !errors.Is(err, idempotency.ErrTxEnded) {
			e.failf("the lent transaction's statement after the handler's %s: %v, want idempotency.ErrTxEnded", stmt, err)
		}
	default:
		e.failf("the handler never reached its statement after %s", stmt)
	}
	if n := e.afterRows(key); n != 0 {
		e.failf("%d statements run after the handler's %s committed", n, stmt)
	}
	again := e.send(key)
	e.expect("retry", again, retryWant)
	e.within("retry", again, 0)
	e.atMostOnce(key, want)
}

// afterRows counts the ledger rows of key written after the handler ended
// its transaction.
func (e *env) afterRows(key string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := e.se.direct.QueryRowContext(ctx, e.se.q("SELECT count(*) FROM matrix_ledger WHERE k = $1 AND note = 'after'"), key).Scan(&n); err != nil {
		e.failf("count the ledger: %v", err)
	}
	return n
}

// sessionFault: the handler changes its session with pgStmt (PostgreSQL)
// or myStmt (MariaDB; "" = N/A); the call answers 201 and commits once,
// and the next calls' sessions are as before (current_user, search_path,
// synchronous_commit or @@time_zone as the direct session sees them).
func sessionFault(name, pgStmt, myStmt string) *fault {
	na := both(needsTx, needsDB(naMemoryDB), func(c column) string {
		if c.store.mysql() && myStmt == "" {
			return naNotPG
		}
		return ""
	})
	probe := "SELECT current_user || ' ' || current_setting('search_path') || ' ' || current_setting('synchronous_commit')"
	myProbe := "SELECT CONCAT(CURRENT_USER(), ' ', CURRENT_ROLE(), ' ', @@session.time_zone)"
	return &fault{name: name, na: na, run: func(t *testing.T, c cell) {
		if !c.store.mysql() {
			ensureLowRole(t)
		}
		stmt, q := pgStmt, probe
		if c.store.mysql() {
			stmt, q = myStmt, myProbe
		}
		seen := make(chan string, 8)
		key := newKey() // the call that changes its session
		h := func(ctx context.Context, hc *hctx) (int, []byte) {
			if s, err := lentString(ctx, q); err == nil {
				seen <- s
			} else {
				seen <- "error: " + err.Error()
			}
			if err := hc.effect(ctx); err != nil {
				return failure(err)
			}
			if hc.key == key {
				_ = lentExec(ctx, stmt)
			}
			return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
		}
		e := newEnv(t, c, envOpts{h: h, storeOpts: storeOpts{maxConns: 2}})
		if !c.store.mysql() {
			grantLow(e)
		}
		before := e.send(newKey())
		e.expect("a call before", before, "")
		want := recv(seen)
		first := e.send(key)
		recv(seen)
		e.expect("the call that changes its session", first, "")
		e.within("the call that changes its session", first, 0)
		again := e.send(key)
		e.expect("its retry", again, "")
		if again.handler && !again.replayed {
			e.failf("retry: ran again (want a replay): %v", again)
		}
		e.atMostOnce(key, 1)
		for i := range 4 {
			a := e.send(newKey())
			e.expect(fmt.Sprintf("call %d after", i), a, "")
			if a.err == nil && a.handler {
				if got := recv(seen); got != want {
					e.failf("call %d after: the session is %q, was %q: the handler's %s outlived its route", i, got, want, stmt)
				}
			}
		}
	}}
}

// recv is the next value of ch, or "" after 10 s.
func recv(ch chan string) string {
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		return ""
	}
}

// lowRole is a role without rights on the idempotency table, for SET ROLE.
const lowRole = "matrix_low"

var lowRoleOnce sync.Once

// ensureLowRole creates lowRole on the server once (roles are the
// cluster's, not the schema's; it stays for the next run).
func ensureLowRole(t *testing.T) {
	lowRoleOnce.Do(func() {
		db := openSQL(t, "pgx", testdb.ServerURL(t), 1)
		_, err := db.ExecContext(t.Context(), `DO $$ BEGIN CREATE ROLE `+lowRole+` NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
		if err != nil {
			t.Fatalf("create role %s: %v", lowRole, err)
		}
	})
}

// grantLow lets lowRole write the cell's ledger, so the handler's writes
// after SET ROLE succeed, and nothing of the idempotency table.
func grantLow(e *env) {
	for _, s := range []string{
		"DO $$ BEGIN EXECUTE 'GRANT USAGE ON SCHEMA ' || quote_ident(current_schema()) || ' TO " + lowRole + "'; END $$",
		"GRANT SELECT, INSERT ON matrix_ledger TO " + lowRole,
	} {
		if _, err := e.se.direct.ExecContext(e.t.Context(), s); err != nil {
			e.t.Fatalf("%s: %v", s, err)
		}
	}
}
