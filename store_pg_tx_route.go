package idempotency

import (
	"context"
	"errors"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgRouteTx is a PostgresStore's RouteTx: pgx's transaction on a
// connection taken from the pool, given back when the transaction ends.
// Its COMMIT goes pipelined with the record, not through tx.Commit, so pgx
// still counts tx open afterwards: only the middleware, which never hands
// tx out again once the handler returned (handlerTx), may hold it.
type pgRouteTx struct {
	s       *PostgresStore
	c       *pgxpool.Conn // nil once given back
	tx      pgx.Tx        // qualifies what it sends (pgQualifiedTx)
	q       *pgQualified  // the store's table, as its statements name it
	session pgSession     // the session's state at BEGIN
	// bounds are statement_timeout and idle_in_transaction_session_timeout
	// as the claim bounded them (pgsql.TxBoundsSQL); unclaimed, the session's.
	bounds [2]string
	gate   *txGate // the handler's view, once lent
}

// pipe sends steps in the transaction (sendPipe), qualified.
func (t *pgRouteTx) pipe(ctx context.Context, steps ...pgStep) *pgPipe {
	return sendPipe(ctx, t.tx.Conn(), t.q, false, steps...)
}

// Tx implements RouteTx: the pgx.Tx.
func (t *pgRouteTx) Tx() any { return t.tx }

// Lend implements RouteTx: the handler's view is a handlerTx behind its
// gate (handler_tx.go, TxFromContext).
func (t *pgRouteTx) Lend(ctx context.Context) (context.Context, func()) {
	ctx, t.gate = withTx(ctx, t.tx)
	return ctx, t.gate.close
}

// State implements RouteTx from the connection and the transaction status
// the server reports after each statement (pgconn's TxStatus). A
// transaction the gate saw end under the handler is TxEnded even when the
// connection closed afterwards: its COMMIT may have made the claim
// permanent.
func (t *pgRouteTx) State() TxState {
	if t.gate != nil && t.gate.ended.Load() {
		return TxEnded
	}
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

// Takeover implements RouteTx: the fenced UPDATE of pgsql.TxTakeoverSQL
// inside the transaction, between the lock wait and the session's
// lock_timeout, then the savepoint, pipelined. The transaction holds the
// table's lock since its claim, so a lock wait that runs out here is the
// row's: another open transaction is taking it over.
func (t *pgRouteTx) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	var rec Record
	p := t.pipe(ctx,
		pgStep{sql: pgSetLocal("lock_timeout", pgInterval(cmpWait(req.LockWait))), alone: true},
		pgStep{sql: pgsql.TxTakeoverSQL, args: []any{f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner), f.Key, f.Endpoint}},
		pgStep{sql: pgsql.SavepointSQL},
		pgStep{sql: pgSetLocal("lock_timeout", t.session.lock), alone: true})
	_, err := p.Exec()
	if err == nil {
		err = scanRecord(p.QueryRow(), &rec)
	}
	for range 2 {
		if err == nil {
			_, err = p.Exec()
		}
	}
	err = closeBatch(p, err)
	switch {
	case err == nil:
		return ClaimResult{Won: true, Record: rec}, nil
	case errors.Is(err, pgx.ErrNoRows), isLockWait(err):
		// Lost: another owner took the row first, or is taking it over
		// in an open transaction (then this one is aborted: the caller
		// rolls it back).
		return ClaimResult{}, nil
	}
	return ClaimResult{}, pgStoreError("takeover", err)
}

// EndLease implements RouteTx: pgsql.EndLeaseSQL on a connection of the pool,
// the route's own given back by Abort.
func (t *pgRouteTx) EndLease(ctx context.Context, f Fence) error {
	return pgOwnerError("end_lease", t.s.fenced(ctx, pgsql.EndLeaseSQL, f))
}

// isLockWait reports a lock wait that ran out (lock_not_available).
func isLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
