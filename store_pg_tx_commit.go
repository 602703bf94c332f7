package idempotency

// How a transactional route's transaction ends (RouteTx.Commit and Abort
// of pgRouteTx): the record pipelined with COMMIT, or a rollback, and the
// connection given back to the pool.

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Commit implements RouteTx. Settled: the rollback to the savepoint
// (Undo), then one pipelined batch of SET CONSTRAINTS ALL IMMEDIATE, the
// fenced record (pgTxCompleteSQL or pgTxFailSQL) and COMMIT. Unclaimed
// (s nil): COMMIT alone, pgx's Commit. The connection goes back to the pool once
// committed; on an error the caller ends the transaction (Abort).
func (t *pgRouteTx) Commit(ctx context.Context, s *Settlement) error {
	if t.c == nil {
		return pgStoreError("commit", pgx.ErrTxClosed)
	}
	var err error
	if s != nil {
		err = t.record(ctx, s)
	} else if err = t.tx.Commit(ctx); err != nil {
		err = pgStoreError("commit", err)
	}
	if err == nil {
		t.release()
	}
	return err
}

// record writes s's record in the transaction and commits.
func (t *pgRouteTx) record(ctx context.Context, s *Settlement) error {
	op, sql, args := "fail", pgTxFailSQL, []any{s.Fence.ID, s.Fence.Attempt, s.Fence.Scope}
	if !s.Failed {
		// A failed statement aborts the transaction, so there is no second
		// try: every JSON body JSONB might refuse is stored raw up front.
		jsonBody, rawBody, headers, err := completeArgs(s.Response, true)
		if err != nil {
			return err
		}
		op, sql = "complete", pgTxCompleteSQL
		args = append(args, s.Response.Status, jsonbArg(jsonBody), rawBody, jsonbArg(headers), sealKeyArg(s.Response.SealKeyID))
	}
	if s.Undo {
		// Alone, not in the batch: an aborted transaction refuses even to
		// prepare the batch's other statements until it is rolled back.
		// Only failure paths pay this round trip.
		if _, err := t.tx.Exec(ctx, pgRollbackToSavepointSQL); err != nil {
			return pgStoreError(op, err)
		}
	}
	// One batch: an error skips the rest of it, so COMMIT runs only after
	// the constraints held and the record found its row.
	b := &pgx.Batch{}
	b.Queue(pgImmediateSQL)
	b.Queue(sql, args...)
	b.Queue(pgCommitSQL)
	br := t.tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if isIntegrityViolation(err) {
		err = errors.Join(ErrDeferredConstraint, err)
	}
	recorded := false
	if err == nil {
		_, err = br.Exec()
		recorded = err == nil
	}
	var tag pgconn.CommandTag
	if recorded {
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, ErrDeferredConstraint):
		return &StoreError{Op: op, Reason: ReasonData, Err: err}
	case !recorded && isDivisionByZero(err):
		return ErrNotOwner // the guard of pgTxCompleteSQL and pgTxFailSQL: no row matched
	case !recorded:
		return pgStoreError(op, err)
	case err != nil:
		return pgStoreError("commit", err)
	}
	return nil
}

// isIntegrityViolation reports an integrity constraint violation (SQLSTATE
// class 23), what a deferred constraint raises when it is checked.
func isIntegrityViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23")
}

// isDivisionByZero reports division_by_zero (22012), what the guard of
// pgTxCompleteSQL and pgTxFailSQL raises when the record matched no row.
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
	if pc.IsClosed() || pc.TxStatus() == 'I' {
		return nil
	}
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// release gives the connection back to the pool, once.
func (t *pgRouteTx) release() {
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}
