package idempotency

// How a transactional route's transaction ends (RouteTx.Commit and Abort
// of pgRouteTx): the record pipelined with COMMIT, or a rollback, and the
// connection given back to the pool.

import (
	"context"
	"errors"
	"strings"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Commit implements RouteTx. Settled: the rollback to the savepoint
// (Undo), then one pipelined batch that puts back the state the claim
// found (restoreSteps: whatever the handler set with SET LOCAL), SET
// CONSTRAINTS ALL IMMEDIATE, the fenced record (pgsql.TxCompleteSQL or
// pgsql.TxFailSQL), COMMIT and the session's state read. Unclaimed (s nil):
// COMMIT and the read. The connection goes back to the pool once
// committed, as BEGIN found it (afterCommit); on an error the caller ends
// the transaction (Abort).
func (t *pgRouteTx) Commit(ctx context.Context, s *Settlement) error {
	if t.c == nil {
		return pgStoreError("commit", pgx.ErrTxClosed)
	}
	var err error
	if s != nil {
		err = t.record(ctx, s)
	} else {
		err = t.commit(ctx, "commit", nil, 0)
	}
	if err == nil {
		t.release()
	}
	return err
}

// record writes s's record in the transaction and commits.
func (t *pgRouteTx) record(ctx context.Context, s *Settlement) error {
	f := s.Fence
	op, sql, args := "fail", pgsql.TxFailSQL, []any{f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint}
	if !s.Failed {
		jsonBody, rawBody, headers, err := completeArgs(s.Response)
		if err != nil {
			return err
		}
		op, sql = "complete", pgsql.TxCompleteSQL
		args = []any{f.ID, f.Attempt, f.Scope, s.Response.Status, jsonBody, rawBody, headers, sealKeyArg(s.Response.SealKeyID), f.Key, f.Endpoint}
	}
	if s.Undo {
		// Alone, not in the batch: an aborted transaction refuses even to
		// prepare the batch's other statements until it is rolled back.
		// Only failure paths pay this round trip.
		if _, err := t.tx.Exec(ctx, pgsql.RollbackToSavepointSQL); err != nil {
			return pgStoreError(op, err)
		}
	}
	steps, err := t.beforeRecord(ctx)
	if err != nil {
		return pgStoreError(op, err)
	}
	// One batch: an error skips the rest of it, so COMMIT runs only after
	// the state was put back, the constraints held and the record found
	// its row.
	n := len(steps)
	steps = append(steps, pgStep{sql: pgsql.ImmediateSQL}, pgStep{sql: sql, args: args})
	return t.commit(ctx, op, steps, n)
}

// commit sends steps (the first n of them restore the claim's state, the
// next two check the constraints and record), then COMMIT and the
// session's state read, and reads their results.
func (t *pgRouteTx) commit(ctx context.Context, op string, steps []pgStep, n int) error {
	steps = append(steps, pgStep{sql: pgsql.CommitSQL}, pgStep{sql: pgsql.TxSessionSQL})
	p := t.pipe(ctx, steps...)
	var err error
	for i := 0; i < len(steps)-2 && err == nil; i++ {
		_, err = p.Exec()
		if i == n && isIntegrityViolation(err) {
			err = errors.Join(ErrDeferredConstraint, err)
		}
	}
	recorded := err == nil
	if recorded {
		var tag pgconn.CommandTag
		if tag, err = p.Exec(); err == nil && tag.String() != "COMMIT" {
			err = pgx.ErrTxCommitRollback
		}
	}
	var now *pgSession
	if recorded && err == nil {
		now = new(pgSession)
		if now.scan(p.QueryRow()) != nil {
			now = nil
		}
	}
	cerr := p.Close()
	if err == nil && now != nil && cerr != nil {
		now = nil // the read failed after COMMIT: the commit stands
	}
	switch {
	case errors.Is(err, ErrDeferredConstraint):
		return &StoreError{Op: op, Reason: ReasonData, Err: err}
	case !recorded && isDivisionByZero(err):
		return ErrNotOwner // the guard of pgsql.TxCompleteSQL and pgsql.TxFailSQL: no row matched
	case !recorded:
		return pgStoreError(op, err)
	case err != nil:
		return pgStoreError("commit", err)
	}
	t.afterCommit(ctx, now)
	return nil
}

// isIntegrityViolation reports an integrity constraint violation (SQLSTATE
// class 23), what a deferred constraint raises when it is checked.
func isIntegrityViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23")
}

// isDivisionByZero reports division_by_zero (22012), what the guard of
// pgsql.TxCompleteSQL and pgsql.TxFailSQL raises when the record matched no row.
func isDivisionByZero(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22012"
}

// Abort implements RouteTx.
func (t *pgRouteTx) Abort(ctx context.Context) error {
	if err := t.rollback(ctx); err != nil {
		return pgStoreError("rollback", err)
	}
	return nil
}

// end rolls the transaction back, ignoring an error: the connection goes
// back to the pool either way (closed by it when not idle).
func (t *pgRouteTx) end(ctx context.Context) { _ = t.rollback(ctx) }

// rollback rolls the transaction back (unless none is open: one the
// handler or a failed COMMIT ended, or a closed connection) and gives the
// connection back. The pool closes a connection left in a transaction,
// as a failed ROLLBACK leaves it.
func (t *pgRouteTx) rollback(ctx context.Context) error {
	if t.c == nil {
		return nil
	}
	defer t.release()
	pc := t.c.Conn().PgConn()
	switch {
	case pc.IsClosed():
		return nil
	case pc.TxStatus() == 'I' && t.session == (pgSession{}):
		return nil // no transaction began
	case pc.TxStatus() == 'I':
		// The handler ended the transaction itself (or a COMMIT failed):
		// what it committed may have changed the session.
		var now pgSession
		if err := now.scan(t.c.Conn().QueryRow(ctx, pgsql.TxSessionSQL)); err != nil {
			t.afterCommit(ctx, nil)
		} else {
			t.afterCommit(ctx, &now)
		}
		return nil
	}
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// release gives the connection back to the pool, once; one pgx closed
// (a deadline interrupted a statement) leaves the pool at once (release).
func (t *pgRouteTx) release() {
	if t.c != nil {
		release(t.c)
		t.c = nil
	}
}
