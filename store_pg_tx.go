package idempotency

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ TxStore = (*PostgresStore)(nil)

// BeginClaim implements TxStore: one pipelined batch of BEGIN (pgx's
// Batch.BeginTx), the session's state read with the claim's bounds, the
// claim and the savepoint; a loser then reads the existing row
// (pgTxReadSQL). A serialization failure or a lock wait that ran out rolls
// back and begins again, a bounded number of times.
func (s *PostgresStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	if req == nil {
		t, _, err := s.begin(ctx, nil, "", "")
		if err != nil {
			return nil, ClaimResult{}, pgStoreError("begin", err)
		}
		return t, ClaimResult{}, nil
	}
	// A serialization failure comes at REPEATABLE READ or SERIALIZABLE,
	// when the owner the claim waited for commits; a lock wait, exhausted
	// says.
	wait, lease := pgInterval(cmpWait(req.LockWait)), pgInterval(req.Lease)
	var last error
	for range pgRetries {
		t, res, err := s.begin(ctx, req, wait, lease)
		switch {
		case t == nil:
			// The batch failed before BEGIN took effect. A server error
			// there is the claim's (its statements are prepared before the
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
		case isRetryable(err), errors.As(err, new(claimLockWait)):
			last = err
		default:
			t.end(ctx)
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
		t.end(ctx)
		if err := ctx.Err(); err != nil {
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
	}
	return nil, ClaimResult{}, exhausted(last)
}

// exhausted is the outcome of a claim whose every try failed with last:
// nil for a lock wait on the claim (contention, not a store error: another
// open transaction holds the key, its owner is mid-handler), the outage
// of a lock wait on the table (DDL, a migration), else a conflict. A
// single wait proves neither: the claim also waits, for microseconds, on
// the table's extension or another claim's speculative insertion.
func exhausted(last error) error {
	var lw claimLockWait
	switch {
	case errors.As(last, &lw) && !lw.table:
		return nil
	case errors.As(last, &lw):
		return pgStoreError("claim", last)
	}
	return &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// begin takes a connection and sends BEGIN and the session's state read
// (pgTxSessionSQL, or pgTxBoundsSQL with the claim's bounds), pipelined
// with req's claim (nil: no claim). When no transaction began
// (no connection, BEGIN failed) it returns a nil pgRouteTx, the connection
// given back; any later error comes with the pgRouteTx to end. A claim
// that lost reads the existing row (claimLost).
func (s *PostgresStore) begin(ctx context.Context, req *ClaimRequest, wait, lease string) (*pgRouteTx, ClaimResult, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, ClaimResult{}, err
	}
	// The session's lock_timeout, as last read on this connection, goes
	// back after the claim; checked against what this batch reads.
	restored, _ := c.Conn().PgConn().CustomData()[lockTimeoutKey].(string)
	steps := []pgStep{{sql: pgTxSessionSQL}}
	if req != nil {
		steps[0] = pgStep{sql: pgTxBoundsSQL, args: []any{lease}}
		steps = append(steps, claimSteps(*req, wait, restored, true)...)
	}
	p := sendPipe(ctx, c.Conn(), true, steps...)
	t := &pgRouteTx{c: c, tx: p.Tx()}
	if _, err = p.Exec(); err != nil {
		_ = p.Close()
		t.end(ctx)
		return nil, ClaimResult{}, err
	}
	var res ClaimResult
	if req == nil {
		err = t.session.scan(p.QueryRow())
	} else if err = t.session.scan(p.QueryRow(), &t.bounds[0], &t.bounds[1]); err == nil {
		res, err = readClaim(p, *req, true)
	}
	err = closeBatch(p, err)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return t, res, err
	}
	c.Conn().PgConn().CustomData()[lockTimeoutKey] = t.session.lock
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res, err = t.claimLost(ctx, *req, wait)
	case req != nil && restored != t.session.lock:
		// Put back what this connection's session really has.
		_, err = t.tx.Exec(ctx, pgSetLocal("lock_timeout", t.session.lock))
	}
	return t, res, err
}

// closeBatch closes br and returns err, the batch's first error read, or
// the error closing it reports when err is nil or only pgx.ErrNoRows (a
// claim that lost, a takeover that matched nothing: the batch's later
// statements may still have failed).
func closeBatch(br interface{ Close() error }, err error) error {
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

// pgInterval is d as a setting's text value in milliseconds, rounded up
// (at least 1: 0 would mean no bound at all).
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(pgMillis(d), 1), 10) + "ms"
}

// pgMillis is d in whole milliseconds, rounded up: the bound PostgreSQL
// applies for d.
func pgMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// claimSteps are a transactional claim's statements: the lock wait, the
// table's lock (first claim of the transaction only), the INSERT, the
// savepoint, and the session's lock_timeout (restored, "" for the
// default) back. A lock wait that runs out on the table lock is the
// table's, one that runs out on the INSERT a row's (readClaim).
func claimSteps(req ClaimRequest, wait, restored string, first bool) []pgStep {
	steps := []pgStep{{sql: pgSetLocal("lock_timeout", wait), alone: true}}
	if first {
		steps = append(steps, pgStep{sql: pgTxLockSQL})
	}
	return append(steps,
		pgStep{sql: pgTxClaimSQL, args: claimArgs(req)},
		pgStep{sql: pgSavepointSQL},
		pgStep{sql: pgSetLocal("lock_timeout", restored), alone: true})
}

// claimLockWait is a lock wait of a claim's batch that ran out: on the
// table's lock (table), or on the claim.
type claimLockWait struct {
	error
	table bool
}

func (e claimLockWait) Unwrap() error { return e.error }

// readClaim reads the results of claimSteps into a ClaimResult; it
// returns pgx.ErrNoRows when the claim lost (the key has a row), and a
// claimLockWait when a lock wait ran out, telling which statement waited.
func readClaim(p *pgPipe, req ClaimRequest, first bool) (ClaimResult, error) {
	var (
		rec Record
		won bool
	)
	_, err := p.Exec()
	if err == nil && first {
		if _, err = p.Exec(); isLockWait(err) {
			return ClaimResult{}, claimLockWait{err, true}
		}
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = p.Query(); err == nil {
			err = scanClaimRows(rows, req, &rec, &won)
		}
		if isLockWait(err) {
			return ClaimResult{}, claimLockWait{err, false}
		}
	}
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		lost := err != nil
		if _, err = p.Exec(); err == nil {
			_, err = p.Exec()
		}
		if err == nil && lost {
			err = pgx.ErrNoRows
		}
	}
	if err != nil {
		return ClaimResult{}, err
	}
	return ClaimResult{Won: won, Record: rec}, nil
}

// claimLost reads the existing row of a claim that lost (pgTxReadSQL; a
// plain read never waits on a lock). When that read finds no row (cleanup
// or a release removed it meanwhile) it claims again in the same
// transaction; it returns pgx.ErrNoRows when that kept happening.
func (t *pgRouteTx) claimLost(ctx context.Context, req ClaimRequest, wait string) (ClaimResult, error) {
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
		p := sendPipe(ctx, t.tx.Conn(), false, claimSteps(req, wait, t.session.lock, false)...)
		res, err := readClaim(p, req, false)
		if err = closeBatch(p, err); !errors.Is(err, pgx.ErrNoRows) {
			return res, err
		}
	}
	return ClaimResult{}, pgx.ErrNoRows
}
