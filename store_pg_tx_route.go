package idempotency

import (
	"context"
	"errors"
	"strings"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The route transaction after its claim (pgRouteTx): lending it to the
// handler, its takeover, the record pipelined with COMMIT, and the session
// given back to the pool as the store found it.

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
// gate (store_pg_lend.go, TxFromContext).
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
		pgStep{sql: pgsql.TxTakeoverSQL, args: []any{f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner), f.Key, f.Endpoint, req.DeriveKeyID}},
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
		return ClaimResult{Lost: true}, nil
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

// How a transactional route's transaction ends (RouteTx.Commit and Abort
// of pgRouteTx): the record pipelined with COMMIT, or a rollback, and the
// connection given back to the pool.

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

// What a transactional route's handler does to its session never reaches
// the record, nor outlives its request:
// the record and COMMIT run with the state the claim found, and after
// COMMIT the connection goes back to the pool as the store found it, or is
// destroyed.

// pgSession is the session's state a transactional route depends on, as
// pgsql.TxSessionSQL reads it.
type pgSession struct {
	role, searchPath, syncCommit, statement, lock, idle, user string
}

// scan reads pgsql.TxSessionSQL's row into s, and any columns after it into
// more.
func (s *pgSession) scan(row pgx.Row, more ...any) error {
	return row.Scan(append([]any{&s.role, &s.searchPath, &s.syncCommit, &s.statement, &s.lock, &s.idle, &s.user}, more...)...)
}

// lockTimeoutKey is where a connection's CustomData keeps its session's
// lock_timeout as last read, for the claim's batch to put back after the
// claim without a round trip of its own.
const lockTimeoutKey = "idempotency.lock_timeout"

// pgSetLocal is SET LOCAL name to value, a setting's value as the server
// shows it (a number with its unit, or a word such as "on"); any other
// text sets the default instead, so that no text the server returned
// becomes SQL.
func pgSetLocal(name, value string) string { return pgSet("SET LOCAL ", name, value) }

// pgSet is pgSetLocal with its SET command (SET or SET LOCAL).
func pgSet(set, name, value string) string {
	for _, r := range value {
		if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '_') {
			return set + name + " TO DEFAULT"
		}
	}
	if value == "" {
		return set + name + " TO DEFAULT"
	}
	return set + name + " = '" + value + "'"
}

// pgSetRole is SET (LOCAL) ROLE to role, as current_setting('role') shows
// it ("none": the session user's own).
func pgSetRole(set, role string) string {
	if role == "none" {
		return set + "ROLE NONE"
	}
	return set + "ROLE " + pgx.Identifier{role}.Sanitize()
}

// restoreSteps are the steps that put back, before the record, the state
// the claim found (its bounds in force): statement_timeout first (the
// handler's own bounds only that first statement), with search_path and
// idle_in_transaction_session_timeout, then the role, synchronous_commit
// and lock_timeout, with SET LOCAL, which Citus passes to its workers.
// With now (read just before, in pgx's simple protocol, where each SET
// LOCAL costs a round trip) only those that changed; with nil all of
// them, pipelined.
func (t *pgRouteTx) restoreSteps(now *pgSession) []pgStep {
	want := t.session
	want.statement, want.idle = t.bounds[0], t.bounds[1]
	var steps []pgStep
	if now == nil || now.statement != want.statement || now.searchPath != want.searchPath || now.idle != want.idle {
		steps = append(steps, pgStep{sql: pgsql.TxRestoreSQL, args: []any{want.statement, want.searchPath, want.idle}})
	}
	if now == nil || now.role != want.role {
		steps = append(steps, pgStep{sql: pgSetRole("SET LOCAL ", want.role), alone: true})
	}
	if now == nil || now.syncCommit != want.syncCommit {
		steps = append(steps, pgStep{sql: pgSetLocal("synchronous_commit", want.syncCommit), alone: true})
	}
	if now == nil || now.lock != want.lock {
		steps = append(steps, pgStep{sql: pgSetLocal("lock_timeout", want.lock), alone: true})
	}
	return steps
}

// beforeRecord returns the steps that put the claim's state back before
// the record, pipelined with it. The record names the table qualified
// (pgQualified), so pgx may parse it under whatever search_path the
// handler set. Under pgx's simple protocol it reads the state first, and
// only the settings that changed go back, each SET LOCAL alone.
func (t *pgRouteTx) beforeRecord(ctx context.Context) ([]pgStep, error) {
	if queryMode(t.tx.Conn()) != pgx.QueryExecModeSimpleProtocol {
		return t.restoreSteps(nil), nil
	}
	var now pgSession
	if err := now.scan(t.tx.QueryRow(ctx, pgsql.TxSessionSQL)); err != nil {
		return nil, err
	}
	return t.restoreSteps(&now), nil
}

// afterCommit puts the session back as BEGIN found it when the committed
// transaction changed it (now, read after COMMIT; nil when that read
// failed), and destroys the connection when it cannot: a handler's SET
// without LOCAL (search_path, role, a timeout) must not reach the next
// request on this connection.
func (t *pgRouteTx) afterCommit(ctx context.Context, now *pgSession) {
	if now != nil && *now == t.session {
		return
	}
	err := errors.New("the session state after COMMIT could not be read")
	if now != nil {
		err = t.restoreSession(ctx)
	}
	if err != nil {
		// Closed, the pool destroys it when it is given back.
		_ = t.c.Conn().Close(ctx)
	}
}

// restoreSession sets the session's state back to what BEGIN found, and
// checks it took.
func (t *pgRouteTx) restoreSession(ctx context.Context) error {
	s := t.session
	p := sendPipe(ctx, t.c.Conn(), t.q, false,
		pgStep{sql: pgSetRole("SET ", s.role)},
		pgStep{sql: pgsql.SessionRestoreSQL, args: []any{s.searchPath, s.statement, s.idle}},
		pgStep{sql: pgSet("SET ", "synchronous_commit", s.syncCommit)},
		pgStep{sql: pgSet("SET ", "lock_timeout", s.lock)},
		pgStep{sql: pgsql.TxSessionSQL})
	var err error
	for range 4 {
		if _, err = p.Exec(); err != nil {
			break
		}
	}
	var now pgSession
	if err == nil {
		err = now.scan(p.QueryRow())
	}
	if err = closeBatch(p, err); err == nil && now != s {
		err = errors.New("the session state could not be put back")
	}
	return err
}
