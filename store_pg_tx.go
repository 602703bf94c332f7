package idempotency

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ TxStore = (*PostgresStore)(nil)

// BeginClaim implements TxStore: BEGIN (its own round trip: pgx.Tx sends
// it alone), then one pipelined batch of the bounds, the claim
// (pgTxClaimSQL), the restored lock_timeout and the savepoint; a loser
// then reads the existing row (pgTxReadSQL). A serialization failure
// (REPEATABLE READ or SERIALIZABLE, when the owner it waited for commits)
// or a lock wait that ran out on no row rolls back and begins again, a
// bounded number of times.
func (s *PostgresStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	if req == nil {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, ClaimResult{}, pgStoreError("begin", err)
		}
		return &pgRouteTx{tx: tx}, ClaimResult{}, nil
	}
	wait, lease := pgInterval(cmpWait(req.LockWait)), pgInterval(req.Lease)
	var last error
	for range pgRetries {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, ClaimResult{}, pgStoreError("begin", err)
		}
		t := &pgRouteTx{tx: tx}
		res, err := t.claim(ctx, *req, wait, lease)
		switch {
		case err == nil:
			return t, res, nil
		case errors.Is(err, pgx.ErrNoRows):
			last = errClaimVanished
		case isRetryable(err):
			last = err
		case isLockWait(err) && !isRowLockWait(err):
			// No row named: a table-level lock (DDL, a migration), or a
			// wait on another claim's speculative insertion of the same
			// key, which names no row either but lasts microseconds.
			// Begin again: a table lock outlasts every round.
			last = err
		case isRowLockWait(err):
			// Contention, not a store error: another open transaction
			// holds the key (its owner is mid-handler).
			_ = t.rollback(ctx)
			return nil, ClaimResult{}, nil
		default:
			_ = t.rollback(ctx)
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
		_ = t.rollback(ctx)
		if err := ctx.Err(); err != nil {
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
	}
	if isLockWait(last) {
		return nil, ClaimResult{}, pgStoreError("claim", last) // a table-level lock: an outage
	}
	return nil, ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// cmpWait is a lock wait, DefaultTxLockWait for 0.
func cmpWait(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultTxLockWait
	}
	return d
}

// pgInterval is d as a setting's text value in milliseconds (at least 1:
// 0 would mean no bound at all).
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// claim runs the claim batch in t: the bounds, the INSERT (pgTxClaimSQL),
// the restored lock_timeout and the savepoint, pipelined; a claim that
// lost reads the existing row (pgTxReadSQL). When that read finds no row
// (cleanup or a release removed it meanwhile) it claims again in the same
// transaction; it returns pgx.ErrNoRows when that kept happening.
func (t *pgRouteTx) claim(ctx context.Context, req ClaimRequest, wait, lease string) (ClaimResult, error) {
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		b := &pgx.Batch{}
		b.Queue(pgTxBoundsSQL, wait, lease)
		b.Queue(pgTxClaimSQL, claimArgs(req)...)
		b.Queue(pgTxRestoreSQL)
		b.Queue(pgSavepointSQL)
		br := t.tx.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			err = scanClaim(br.QueryRow(), req, &rec, &won)
		}
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			lost := err != nil
			if _, err = br.Exec(); err == nil {
				_, err = br.Exec()
			}
			if err == nil && lost {
				err = pgx.ErrNoRows
			}
		}
		if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
			err = cerr
		}
		switch {
		case err == nil:
			return ClaimResult{Won: won, Record: rec}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return ClaimResult{}, err
		}
		// Lost: the key has a row. A plain read never waits on a lock.
		err = scanClaim(t.tx.QueryRow(ctx, pgTxReadSQL, req.Key, req.Scope, req.Endpoint), req, &rec, &won)
		switch {
		case err == nil:
			return ClaimResult{Won: false, Record: rec}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return ClaimResult{}, err
		}
	}
	return ClaimResult{}, pgx.ErrNoRows
}

// pgRouteTx is a PostgresStore's RouteTx.
type pgRouteTx struct {
	tx pgx.Tx
}

// Tx implements RouteTx.
func (t *pgRouteTx) Tx() pgx.Tx { return t.tx }

// State implements RouteTx from the connection and the transaction status
// the server reports after each statement (pgconn's TxStatus).
func (t *pgRouteTx) State() TxState {
	pc := t.tx.Conn().PgConn()
	if pc.IsClosed() {
		return TxClosed
	}
	switch pc.TxStatus() {
	case 'I': // no transaction open: the handler ended it with SQL
		return TxEnded
	case 'E': // a statement failed and the handler carried on
		return TxAborted
	}
	return TxOpen
}

// Takeover implements RouteTx: the fenced UPDATE of pgTakeoverSQL inside
// the transaction, between the lock wait and its restore, then the
// savepoint, pipelined.
func (t *pgRouteTx) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	var rec Record
	b := &pgx.Batch{}
	b.Queue(pgTxWaitSQL, pgInterval(cmpWait(req.LockWait)))
	b.Queue(pgTakeoverSQL, f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner))
	b.Queue(pgTxRestoreSQL)
	b.Queue(pgSavepointSQL)
	br := t.tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		err = scanRecord(br.QueryRow(), &rec, nil)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		err = cerr
	}
	switch {
	case err == nil:
		return ClaimResult{Won: true, Record: rec}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return ClaimResult{}, nil
	case isRowLockWait(err):
		// Another open transaction is taking the row over: lost. The
		// transaction is aborted; the caller rolls it back.
		return ClaimResult{}, nil
	}
	return ClaimResult{}, pgStoreError("takeover", err)
}

// Commit implements RouteTx: the rollback to the savepoint (Undo), then one
// pipelined batch of SET CONSTRAINTS ALL IMMEDIATE and the fenced record
// (pgCompleteSQL or pgFailSQL), then COMMIT, tx.Commit's own round trip.
func (t *pgRouteTx) Commit(ctx context.Context, s *Settlement) error {
	if s != nil {
		if err := t.record(ctx, s); err != nil {
			return err
		}
	}
	if err := t.tx.Commit(ctx); err != nil {
		return pgStoreError("commit", err)
	}
	return nil
}

// record writes s's record in the transaction.
func (t *pgRouteTx) record(ctx context.Context, s *Settlement) error {
	op, sql, args := "fail", pgFailSQL, []any{s.Fence.ID, s.Fence.Attempt, s.Fence.Scope}
	if !s.Failed {
		// A failed statement aborts the transaction, so there is no second
		// try: every JSON body JSONB might refuse is stored raw up front.
		jsonBody, rawBody, headers, err := completeArgs(s.Response, true)
		if err != nil {
			return err
		}
		op, sql = "complete", pgCompleteSQL
		args = append(args, s.Response.Status, jsonbArg(jsonBody), rawBody, jsonbArg(headers))
	}
	if s.Undo {
		// Alone, not in the batch: an aborted transaction refuses even to
		// prepare the batch's other statements until it is rolled back.
		// Only failure paths pay this round trip.
		if _, err := t.tx.Exec(ctx, pgRollbackToSavepointSQL); err != nil {
			return pgStoreError(op, err)
		}
	}
	b := &pgx.Batch{}
	b.Queue(pgImmediateSQL)
	b.Queue(sql, args...)
	br := t.tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if isIntegrityViolation(err) {
		err = errors.Join(ErrDeferredConstraint, err)
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, ErrDeferredConstraint):
		return &StoreError{Op: op, Reason: ReasonData, Err: err}
	case err != nil:
		return pgStoreError(op, err)
	case tag.RowsAffected() == 0:
		return ErrNotOwner
	}
	return nil
}

// isIntegrityViolation reports an integrity constraint violation (SQLSTATE
// class 23), what a deferred constraint raises when it is checked.
func isIntegrityViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23")
}

// Abort implements RouteTx.
func (t *pgRouteTx) Abort(ctx context.Context) error {
	if err := t.rollback(ctx); err != nil {
		return pgStoreError("rollback", err)
	}
	return nil
}

// rollback rolls the transaction back; one already ended is no error.
func (t *pgRouteTx) rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// isLockWait reports a lock wait that ran out (lock_not_available).
func isLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// isRowLockWait reports a lock wait that ran out on a row of the key
// (lock_not_available, whose context names the tuple it waited for):
// another open transaction owns the key. One on a table-level lock (DDL, a
// migration) names no tuple: that is an outage like any other. (Neither
// does a wait on a concurrent claim's speculative insertion, which
// BeginClaim tells apart by beginning again.)
func isRowLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" && strings.Contains(pgErr.Where, "tuple")
}
