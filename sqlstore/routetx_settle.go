package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/idemkit/idempotency"
)

// The rest of a route's transaction: the handler's loan, its state, the
// takeover, the record and COMMIT, and how the connection ends.

// Tx implements idempotency.RouteTx: the *sql.Tx.
func (t *routeTx) Tx() any { return t.tx }

// Lend implements idempotency.RouteTx: the handler's *Tx (TxFromContext).
func (t *routeTx) Lend(ctx context.Context) (context.Context, func()) {
	t.known, t.dirty = false, true
	ctx, end := lend(ctx, t.tx)
	return ctx, func() {
		end()
		t.loanEnded = true
	}
}

// State implements idempotency.RouteTx by asking the server, once per
// change, whether the transaction is still open: MariaDB's
// @@in_transaction, MySQL's information_schema.innodb_trx, PostgreSQL's
// clock (now() is the transaction's start inside one); an aborted
// PostgreSQL transaction refuses the question (25P02), and a connection
// that is gone fails it.
func (t *routeTx) State() idempotency.TxState {
	if t.ended {
		return idempotency.TxClosed
	}
	if t.known {
		return t.state
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateTimeout)
	defer cancel()
	q := `SELECT @@in_transaction = 1`
	switch {
	case t.s.d.name == PostgreSQL:
		q = `SELECT now() <> statement_timestamp()`
	case !t.s.mariadb:
		q = `SELECT COUNT(*) > 0 FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()`
	}
	var open bool
	err := t.tx.QueryRowContext(ctx, q).Scan(&open)
	switch {
	case err == nil && open:
		t.state = idempotency.TxOpen
	case err == nil:
		t.state = idempotency.TxEnded
	case hasCode(err, "25P02"):
		t.state = idempotency.TxAborted
	case t.s.isConnLoss(err):
		t.state = idempotency.TxClosed
	default:
		t.state = idempotency.TxAborted
	}
	t.known = t.loanEnded
	return t.state
}

// Takeover implements idempotency.RouteTx: the fenced UPDATE inside the
// transaction, its wait bounded by req.LockWait (a wait that runs out
// loses), then the savepoint.
func (t *routeTx) Takeover(ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	t.known = false
	wait := cmpWait(req.LockWait)
	var res idempotency.ClaimResult
	var err error
	if t.s.d.name == PostgreSQL {
		if err = t.pgLockWait(ctx, wait); err == nil {
			if res, err = t.s.takeoverOn(ctx, t.tx, f, req, ""); err == nil {
				err = t.pgLockWaitRestore(ctx)
			}
		}
	} else {
		err = t.waiting(ctx, wait, func(prefix string) error {
			var err error
			res, err = t.s.takeoverOn(ctx, t.tx, f, req, prefix)
			return err
		})
	}
	switch {
	case err == nil && res.Won:
		if err = t.owned(ctx, req.Lease); err != nil {
			return idempotency.ClaimResult{}, t.s.storeError("takeover", err)
		}
		return res, nil
	case err == nil, t.s.isLockWait(err):
		return idempotency.ClaimResult{}, nil
	}
	return idempotency.ClaimResult{}, t.s.storeError("takeover", err)
}

// Commit implements idempotency.RouteTx: with s.Undo, back to the
// savepoint; the fenced record; COMMIT. An error before COMMIT leaves the
// transaction open.
func (t *routeTx) Commit(ctx context.Context, s *idempotency.Settlement) error {
	t.known = false
	if t.ended {
		return &idempotency.StoreError{Op: "commit", Reason: idempotency.ReasonClosed, Err: sql.ErrTxDone}
	}
	if s != nil {
		if err := t.record(ctx, s); err != nil {
			return err
		}
	}
	if _, err := t.tx.ExecContext(ctx, "COMMIT"); err != nil {
		return t.s.storeError("commit", err)
	}
	t.finish()
	return nil
}

// record writes s's record in the transaction.
func (t *routeTx) record(ctx context.Context, s *idempotency.Settlement) error {
	if s.Undo {
		if _, err := t.tx.ExecContext(ctx, t.s.st.rollbackSavepoint); err != nil {
			return t.s.storeError("commit", err)
		}
	}
	if t.s.d.name == PostgreSQL {
		if err := t.pgRestoreBounds(ctx); err != nil {
			return t.s.storeError("commit", err)
		}
		if _, err := t.tx.ExecContext(ctx, "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
			if hasCode(err, "23503", "23505", "23514", "23P01") {
				return &idempotency.StoreError{Op: "commit", Reason: idempotency.ReasonOther, Err: errors.Join(idempotency.ErrDeferredConstraint, err)}
			}
			return t.s.storeError("commit", err)
		}
	}
	var r sql.Result
	var err error
	f := s.Fence
	if s.Failed {
		r, err = t.tx.ExecContext(ctx, t.s.st.fail, t.s.fenceArgs(f)...)
	} else {
		body, raw, headers, seal, cerr := completeArgs(s.Response)
		if cerr != nil {
			return cerr
		}
		if t.s.d.name == PostgreSQL {
			body, headers = pgBytes(body), pgBytes(headers)
		}
		r, err = t.tx.ExecContext(ctx, t.s.st.complete, append([]any{s.Response.Status, body, raw, headers, seal}, t.s.fenceArgs(f)...)...)
	}
	if err != nil {
		return t.s.storeError("commit", err)
	}
	if n, err := r.RowsAffected(); err != nil {
		return t.s.storeError("commit", err)
	} else if n != 1 {
		return idempotency.ErrNotOwner // the fence owns nothing: taken over, or the handler changed the key's row
	}
	return nil
}

// Abort implements idempotency.RouteTx: ROLLBACK, the claim with it. After
// the transaction ended it changes nothing.
func (t *routeTx) Abort(context.Context) error {
	if t.ended {
		return nil
	}
	err := t.tx.Rollback()
	t.ended = true
	t.cancel()
	t.release()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// finish ends the transaction after its COMMIT: database/sql's Tx is
// marked done (its ROLLBACK finds nothing to undo), and the connection is
// closed (MySQL) or its session reset (PostgreSQL).
func (t *routeTx) finish() {
	_ = t.tx.Rollback()
	t.ended = true
	t.cancel()
	if t.s.d.name == PostgreSQL && !t.pgAfterCommit() {
		t.discard()
		return
	}
	t.release()
}

// release gives the connection back to the pool, or closes it on MySQL
// when its session may have changed (dirty).
func (t *routeTx) release() {
	if t.dirty && t.s.d.name == MySQL {
		t.discard()
		return
	}
	_ = t.c.Close()
}

// discard closes the connection instead of giving it back to the pool.
func (t *routeTx) discard() {
	_ = t.c.Raw(func(any) error { return driver.ErrBadConn })
	_ = t.c.Close()
}
