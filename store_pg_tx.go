package idempotency

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var _ TxStore = (*PostgresStore)(nil)

// BeginClaim implements TxStore: one pipelined batch of BEGIN (pgx's
// Batch.BeginTx), the claim with its bounds (pgTxClaimSQL) and the
// savepoint; a loser then reads the existing row
// (pgTxReadSQL). A serialization failure (REPEATABLE READ or SERIALIZABLE,
// when the owner it waited for commits) or a lock wait that ran out on no
// row rolls back and begins again, a bounded number of times.
func (s *PostgresStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	if req == nil {
		t, _, err := s.begin(ctx, nil, "", "")
		if err != nil {
			return nil, ClaimResult{}, pgStoreError("begin", err)
		}
		return t, ClaimResult{}, nil
	}
	wait, lease := pgInterval(cmpWait(req.LockWait)), pgInterval(req.Lease)
	var last error
	for range pgRetries {
		t, res, err := s.begin(ctx, req, wait, lease)
		switch {
		case t == nil:
			// The batch failed before BEGIN took effect. A server error
			// there is the claim's (its statement is prepared before the
			// batch runs: a missing table, say); BEGIN itself fails only
			// with the connection.
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				return nil, ClaimResult{}, pgStoreError("claim", err)
			}
			return nil, ClaimResult{}, pgStoreError("begin", err)
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
			t.end(ctx)
			return nil, ClaimResult{}, nil
		default:
			t.end(ctx)
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
		t.end(ctx)
		if err := ctx.Err(); err != nil {
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
	}
	if isLockWait(last) {
		return nil, ClaimResult{}, pgStoreError("claim", last) // a table-level lock: an outage
	}
	return nil, ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// begin takes a connection and sends BEGIN, pipelined with req's claim
// (nil: BEGIN alone). When no transaction began (no connection, BEGIN
// failed) it returns a nil pgRouteTx, the connection given back; any later
// error comes with the pgRouteTx to end. A claim that lost reads the
// existing row (claimLost).
func (s *PostgresStore) begin(ctx context.Context, req *ClaimRequest, wait, lease string) (*pgRouteTx, ClaimResult, error) {
	c, err := s.acquire(ctx)
	if err != nil {
		return nil, ClaimResult{}, err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	if req != nil {
		queueClaim(b, *req, wait, lease)
	}
	br := c.Conn().SendBatch(ctx, b)
	t := &pgRouteTx{c: c, tx: br.Tx()}
	var res ClaimResult
	_, err = br.Exec()
	if err != nil {
		_ = br.Close()
		t.end(ctx)
		return nil, ClaimResult{}, err
	}
	if req != nil {
		err = readClaim(br, *req, &res)
	}
	err = closeBatch(br, err)
	if errors.Is(err, pgx.ErrNoRows) {
		res, err = t.claimLost(ctx, *req, wait, lease)
	}
	return t, res, err
}

// closeBatch closes br and returns err, the batch's first error read, or
// the error closing it reports when err is nil or only pgx.ErrNoRows (a
// claim that lost, a takeover that matched nothing: the batch's later
// statements may still have failed).
func closeBatch(br pgx.BatchResults, err error) error {
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		return cerr
	}
	return err
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

// queueClaim queues a transactional claim's statements: the INSERT with
// its bounds (pgTxClaimSQL) and the savepoint.
func queueClaim(b *pgx.Batch, req ClaimRequest, wait, lease string) {
	b.Queue(pgTxClaimSQL, append(claimArgs(req), wait, lease)...)
	b.Queue(pgSavepointSQL)
}

// readClaim reads the results of queueClaim's statements into res; it
// returns pgx.ErrNoRows when the claim lost (the key has a row).
func readClaim(br pgx.BatchResults, req ClaimRequest, res *ClaimResult) error {
	var (
		rec Record
		won bool
	)
	rows, err := br.Query()
	if err == nil {
		err = scanClaimRows(rows, req, &rec, &won)
	}
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		lost := err != nil
		if _, err = br.Exec(); err == nil && lost {
			err = pgx.ErrNoRows
		}
	}
	if err == nil {
		*res = ClaimResult{Won: won, Record: rec}
	}
	return err
}

// claimLost reads the existing row of a claim that lost (pgTxReadSQL; a
// plain read never waits on a lock). When that read finds no row (cleanup
// or a release removed it meanwhile) it claims again in the same
// transaction; it returns pgx.ErrNoRows when that kept happening.
func (t *pgRouteTx) claimLost(ctx context.Context, req ClaimRequest, wait, lease string) (ClaimResult, error) {
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		rows, err := t.tx.Query(ctx, pgTxReadSQL, req.Key, req.Scope, req.Endpoint)
		if err == nil {
			err = scanClaimRows(rows, req, &rec, &won)
		}
		switch {
		case err == nil:
			return ClaimResult{Won: false, Record: rec}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return ClaimResult{}, err
		}
		// Claim again. The lost claim left its lock wait in place: put
		// the session's lock_timeout back first, for the claim to save.
		b := &pgx.Batch{}
		b.Queue(pgTxRestoreSQL)
		queueClaim(b, req, wait, lease)
		br := t.tx.SendBatch(ctx, b)
		var res ClaimResult
		if _, err = br.Exec(); err == nil {
			err = readClaim(br, req, &res)
		}
		err = closeBatch(br, err)
		if !errors.Is(err, pgx.ErrNoRows) {
			return res, err
		}
	}
	return ClaimResult{}, pgx.ErrNoRows
}

// pgRouteTx is a PostgresStore's RouteTx: pgx's transaction on a
// connection taken from the pool, given back when the transaction ends.
// Its COMMIT goes pipelined with the record, not through tx.Commit, so pgx
// still counts tx open afterwards: only the middleware, which never hands
// tx out again once the handler returned (handlerTx), may hold it.
type pgRouteTx struct {
	c  *pgxpool.Conn // nil once given back
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
		err = scanRecord(br.QueryRow(), &rec)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	err = closeBatch(br, err)
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

// isLockWait reports a lock wait that ran out (lock_not_available).
func isLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// isRowLockWait reports a lock wait that ran out on a row of the key
// (lock_not_available, whose context names the tuple it waited for, by
// its id such as "(0,5)"): another open transaction owns the key. One on a
// table-level lock (DDL, a migration) names no tuple: that is an outage
// like any other. (Neither does a wait on a concurrent claim's speculative
// insertion, which BeginClaim tells apart by beginning again.) The tuple
// id, not the word "tuple", is what is looked for: the context is
// translated under a non-English lc_messages, the id is not.
func isRowLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" && tupleID.MatchString(pgErr.Where)
}

// tupleID matches a tuple id, (block,offset), as PostgreSQL prints it.
var tupleID = regexp.MustCompile(`\(\d+,\d+\)`)
