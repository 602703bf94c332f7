package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/pgsql"
)

// The rest of a route's transaction: the handler's loan, its state, the
// takeover, the record and COMMIT, and how the connection ends.

// Tx implements idempotency.RouteTx: the *sql.Conn the transaction runs
// on.
func (t *routeTx) Tx() any { return t.c }

// Lend implements idempotency.RouteTx: the handler's *Tx (TxFromContext).
func (t *routeTx) Lend(ctx context.Context) (context.Context, func()) {
	t.known, t.dirty = false, true
	ctx, lent := lend(ctx, t.c, t.s.endsTx, func() bool { return txIdle(t.c) })
	t.lent = lent
	return ctx, func() {
		lent.end()
		t.loanEnded = true
	}
}

// endsTx reports how a handler's error left the transaction: TxEnded
// when the server ended it with the connection still there (MySQL: a
// deadlock, 1213, which InnoDB answers by rolling the whole transaction
// back, and a lock wait, 1205, whatever innodb_rollback_on_timeout says;
// PostgreSQL: class 40, a deadlock or a
// serialization failure, whose transaction can only be rolled back: its
// handler's work is lost, so its answer must not be recorded); TxClosed when the connection is gone or the
// server ended the session (MySQL's lost-connection codes; PostgreSQL's
// class 08 and 57P01-57P03; driver.ErrBadConn, a network error); TxOpen
// otherwise (any other PostgreSQL error aborts the transaction, which then
// refuses every later statement itself).
func (s *Store) endsTx(err error) idempotency.TxState {
	if code, ok := serverCode(err); ok {
		switch {
		case s.d.name == MySQL && (code == "1213" || code == "1205"),
			s.d.name == PostgreSQL && code[:2] == "40": // class 40, transaction rollback: a deadlock, a serialization failure
			return idempotency.TxEnded
		case s.d.codeReason(code) == idempotency.ReasonConnection && (s.d.name == MySQL || code[:2] == "08" || code[:2] == "57"):
			return idempotency.TxClosed
		}
		return idempotency.TxOpen
	}
	if errors.Is(err, driver.ErrBadConn) || s.reason(err) == idempotency.ReasonConnection {
		return idempotency.TxClosed
	}
	return idempotency.TxOpen
}

// State implements idempotency.RouteTx by asking the server, once per
// change, whether the transaction is still open: MariaDB's
// @@in_transaction, MySQL's information_schema.innodb_trx, PostgreSQL's
// clock (now() is the transaction's start inside one); an aborted
// PostgreSQL transaction refuses the question (25P02), and a connection
// that is gone fails it. A transaction that ended under the handler
// (Tx's refusals: TxEnded when the server rolled it back or the handler's
// own COMMIT or ROLLBACK ended it, TxClosed when its connection is gone),
// or was lost to a call past its deadline, is known without asking.
func (t *routeTx) State() idempotency.TxState {
	switch {
	case t.lost, t.ended:
		return idempotency.TxClosed
	case t.lent != nil:
		if as, err := t.lent.endedBy(); err != nil {
			return as
		}
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
	err := t.run(ctx, func() error { return t.c.QueryRowContext(ctx, q).Scan(&open) })
	switch {
	case t.lost:
		return idempotency.TxClosed
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
	var res idempotency.ClaimResult
	err := t.run(ctx, func() error {
		var err error
		res, err = t.takeover(ctx, f, req)
		return err
	})
	if err != nil {
		return idempotency.ClaimResult{}, t.s.storeError("takeover", err)
	}
	return res, nil
}

// takeover is Takeover, unbounded.
func (t *routeTx) takeover(ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	t.known = false
	wait := cmpWait(req.LockWait)
	var res idempotency.ClaimResult
	var err error
	if t.s.d.name == PostgreSQL {
		if err = t.pgLockWait(ctx, wait); err == nil {
			if res, err = t.s.takeoverOn(ctx, t.c, f, req, ""); err == nil {
				err = t.pgLockWaitRestore(ctx)
			}
		}
	} else {
		err = t.waiting(ctx, wait, func(prefix string) error {
			var err error
			res, err = t.s.takeoverOn(ctx, t.c, f, req, prefix)
			return err
		})
	}
	switch {
	case err == nil && res.Won:
		if err = t.owned(ctx, req.Lease); err != nil {
			return idempotency.ClaimResult{}, err
		}
		return res, nil
	case err == nil, t.s.isLockWait(err):
		return idempotency.ClaimResult{Lost: true}, nil
	}
	return idempotency.ClaimResult{}, err
}

// Commit implements idempotency.RouteTx: with s.Undo, back to the
// savepoint; the fenced record; COMMIT. An error before COMMIT leaves the
// transaction open; a COMMIT that failed, or had no reply by ctx's
// deadline, closes the connection (the row tells whether it committed).
func (t *routeTx) Commit(ctx context.Context, s *idempotency.Settlement) error {
	if t.lost || t.ended {
		return &idempotency.StoreError{Op: "commit", Reason: idempotency.ReasonClosed, Err: sql.ErrTxDone}
	}
	return t.s.storeError("commit", t.run(ctx, func() error { return t.commit(ctx, s) }))
}

// commit is Commit, unbounded.
func (t *routeTx) commit(ctx context.Context, s *idempotency.Settlement) error {
	t.known = false
	if s != nil {
		if err := t.record(ctx, s); err != nil {
			return err
		}
	}
	if _, err := t.c.ExecContext(ctx, "COMMIT"); err != nil {
		t.ended = true
		t.discard()
		return err
	}
	t.ended = true
	t.afterEnd(ctx)
	return nil
}

// record writes s's record in the transaction.
func (t *routeTx) record(ctx context.Context, s *idempotency.Settlement) error {
	if s.Undo {
		if _, err := t.c.ExecContext(ctx, t.s.st.rollbackSavepoint); err != nil {
			return t.s.storeError("commit", err)
		}
	}
	if t.s.d.name == PostgreSQL {
		if err := t.pgRestoreSession(ctx); err != nil {
			return t.s.storeError("commit", err)
		}
		if _, err := t.c.ExecContext(ctx, pgsql.ImmediateSQL); err != nil {
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
		r, err = t.c.ExecContext(ctx, t.s.st.fail, t.s.fenceArgs(f)...)
	} else {
		body, raw, headers, seal, cerr := completeArgs(s.Response)
		if cerr != nil {
			return cerr
		}
		r, err = t.c.ExecContext(ctx, t.s.st.complete, t.s.recordArgs(f, s.Response.Status, body, raw, headers, seal)...)
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

// Abort implements idempotency.RouteTx: ROLLBACK, the claim with it, sent
// under ctx. After the transaction ended it changes nothing.
func (t *routeTx) Abort(ctx context.Context) error {
	if t.lost || t.ended {
		return nil
	}
	return t.run(ctx, func() error { return t.abort(ctx) })
}

// abort is Abort, unbounded: a ROLLBACK that fails closes the connection
// (the server rolls back when it goes).
func (t *routeTx) abort(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if _, err := t.c.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.discard()
		return err
	}
	t.afterEnd(ctx)
	return nil
}

// afterEnd gives the connection back after its transaction ended: closed
// on MySQL when its session may have changed (dirty); on PostgreSQL with
// its session reset first (pgAfterEnd), closed when that fails.
func (t *routeTx) afterEnd(ctx context.Context) {
	switch {
	case t.dirty && t.s.d.name == MySQL:
		t.discard()
	case t.dirty && !t.pgAfterEnd(ctx):
		t.discard()
	default:
		_ = t.c.Close()
	}
}

// discard closes the connection instead of giving it back to the pool.
func (t *routeTx) discard() {
	_ = t.c.Raw(func(any) error { return driver.ErrBadConn })
	_ = t.c.Close()
}
