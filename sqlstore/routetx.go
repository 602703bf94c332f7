package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/idemkit/idempotency"
)

// routeTx is a Store's idempotency.RouteTx: a *sql.Tx on a connection
// taken from the pool explicitly. On MySQL/MariaDB the connection is
// closed, never given back, when the transaction ends: the server has no
// SET LOCAL and the driver does not reset a pooled connection, so whatever
// a handler set on its session (USE, SET SESSION sql_mode, time_zone)
// would otherwise outlive the request. On PostgreSQL the session's
// settings are reset after COMMIT instead (pgAfterCommit).
type routeTx struct {
	s      *Store
	c      *sql.Conn
	tx     *sql.Tx
	cancel context.CancelFunc // the transaction's own context, which outlives the call that began it
	ended  bool
	// dirty: the session may have changed (the handler had it, or the
	// claim set its bounds), so on MySQL the connection is closed at the
	// end; a loser's connection, which nobody changed, goes back to the pool.
	dirty bool

	savedLock string    // PostgreSQL: the lock_timeout a bounded wait puts back
	bounds    [2]string // PostgreSQL: statement_timeout and idle_in_transaction_session_timeout as the claim set them

	// After the handler's loan ended nothing but the store uses the
	// transaction, so State's answer holds until the store's next
	// statement: known says it is current.
	loanEnded bool
	known     bool
	state     idempotency.TxState
}

// stateTimeout bounds the probe of the transaction's state.
const stateTimeout = 2 * time.Second

// BeginClaim implements idempotency.TxStore: BEGIN on a connection of its
// own, the server-side bound of a vanished owner (MariaDB: the session's
// wait_timeout and idle_transaction_timeout, MySQL: wait_timeout, to the
// lease; PostgreSQL: statement_timeout and
// idle_in_transaction_session_timeout, local to the transaction), the
// claim with its wait on another open transaction's row bounded by
// req.LockWait, and the savepoint. A wait that ran out is contention (nil
// RouteTx). A deadlock (1213) or a serialization failure (40001) rolls back
// and begins again, a bounded number of times: the handler has not run.
func (s *Store) BeginClaim(ctx context.Context, req *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.ClaimResult, error) {
	last := errClaimVanished
	for range retries {
		t, err := s.begin(ctx, req)
		if err != nil {
			return nil, idempotency.ClaimResult{}, s.storeError("begin", err)
		}
		if req == nil {
			return t, idempotency.ClaimResult{}, nil
		}
		res, err := t.claim(ctx, *req)
		switch {
		case err == nil:
			return t, res, nil
		case s.isLockWait(err):
			_ = t.Abort(ctx)
			return nil, idempotency.ClaimResult{}, nil
		case hasCode(err, s.d.restart...):
			last = err
		default:
			_ = t.Abort(ctx)
			return nil, idempotency.ClaimResult{}, s.storeError("claim", err)
		}
		_ = t.Abort(ctx)
		if err := ctx.Err(); err != nil {
			return nil, idempotency.ClaimResult{}, s.storeError("claim", err)
		}
	}
	return nil, idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: last}
}

// isLockWait reports a bounded wait on a row that ran out: InnoDB's lock
// wait (1205, MariaDB's no-wait tries included), a statement time limit
// (1969, 3024), PostgreSQL's lock_timeout (55P03).
func (s *Store) isLockWait(err error) bool {
	if s.d.name == PostgreSQL {
		return hasCode(err, "55P03")
	}
	return hasCode(err, "1969", "1205", "3024")
}

// begin takes a connection, bounds its session for a claim, and begins.
func (s *Store) begin(ctx context.Context, req *idempotency.ClaimRequest) (*routeTx, error) {
	c, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	t := &routeTx{s: s, c: c}
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	tx, err := c.BeginTx(txCtx, nil)
	if err != nil {
		cancel()
		t.discard()
		return nil, err
	}
	t.tx, t.cancel = tx, cancel
	if req != nil && s.d.name == PostgreSQL {
		if err := s.pgBound(ctx, tx, req.Lease); err != nil {
			_ = t.Abort(ctx)
			return nil, err
		}
	}
	return t, nil
}

// mysqlBound sets the session's idle bounds to the lease (the smaller
// wins, 0 counting as no bound), so that a vanished owner's connection,
// and the key's row lock with it, ends after about the lease instead of
// wait_timeout's 8 hours. The connection is closed after the route, so
// nothing needs putting back.
func (s *Store) mysqlBound(ctx context.Context, c execer, lease time.Duration) error {
	secs := mysqlLockWaitSeconds(lease)
	q := `SET SESSION wait_timeout = LEAST(@@SESSION.wait_timeout, ?)`
	args := []any{secs}
	if s.mariadb {
		q += `, idle_transaction_timeout = IF(@@SESSION.idle_transaction_timeout = 0, ?, LEAST(@@SESSION.idle_transaction_timeout, ?))`
		args = append(args, secs, secs)
	}
	_, err := c.ExecContext(ctx, q, args...)
	return err
}

// waiting runs f with its wait on another transaction's row lock
// bounded by wait: on MariaDB f's statement, prefixed with mariadbNoWait,
// is tried again until it stops failing with 1205 or wait is over; on
// MySQL 8.0 the session's innodb_lock_wait_timeout is set to wait (whole
// seconds, at least 1) and f runs once. The connection is closed after
// the route, so that setting never outlives it.
func (t *routeTx) waiting(ctx context.Context, wait time.Duration, f func(prefix string) error) error {
	if !t.s.mariadb {
		t.dirty = true
		if _, err := t.tx.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = ?`, mysqlLockWaitSeconds(wait)); err != nil {
			return err
		}
		return f("")
	}
	deadline := time.Now().Add(wait)
	for {
		err := f(mariadbNoWait)
		if !hasCode(err, "1205") || !time.Now().Before(deadline) {
			return err
		}
		select { // polling the lock: InnoDB offers no wait shorter than a second
		case <-time.After(min(time.Millisecond, time.Until(deadline))):
		case <-ctx.Done():
			return err
		}
	}
}

// claim claims req inside the transaction and marks the savepoint when it
// won.
func (t *routeTx) claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	t.known = false
	wait := cmpWait(req.LockWait)
	var res idempotency.ClaimResult
	var err error
	if t.s.d.name == PostgreSQL {
		res, err = t.pgClaim(ctx, req, wait)
	} else {
		res, err = t.mysqlClaim(ctx, req, wait)
	}
	if err == nil && res.Won {
		err = t.owned(ctx, req.Lease)
	}
	return res, err
}

// owned prepares the transaction of a key it now owns, before any handler
// runs: the server-side bound of a vanished owner (MySQL), then the
// savepoint.
func (t *routeTx) owned(ctx context.Context, lease time.Duration) error {
	if t.s.d.name == MySQL {
		t.dirty = true
		if err := t.s.mysqlBound(ctx, t.tx, lease); err != nil {
			return err
		}
	}
	_, err := t.tx.ExecContext(ctx, t.s.st.savepoint)
	return err
}

// mysqlClaim is the plain INSERT, bounded; on 1062 the loser reads the
// row with a locking read (the latest committed version whatever the
// isolation, REPEATABLE READ included), bounded too.
func (t *routeTx) mysqlClaim(ctx context.Context, req idempotency.ClaimRequest, wait time.Duration) (idempotency.ClaimResult, error) {
	for range retries {
		var r sql.Result
		err := t.waiting(ctx, wait, func(prefix string) error {
			var err error
			r, err = t.tx.ExecContext(ctx, prefix+t.s.st.insert, t.s.insertArgs(req)...)
			return err
		})
		if err == nil {
			id, err := r.LastInsertId()
			if err != nil {
				return idempotency.ClaimResult{}, err
			}
			var rec idempotency.Record
			err = scanRecord(t.tx.QueryRowContext(ctx, t.s.st.readID, id, req.Scope), &rec, nil)
			return idempotency.ClaimResult{Won: err == nil, Record: rec}, err
		}
		if !hasCode(err, t.s.d.duplicate...) {
			return idempotency.ClaimResult{}, err
		}
		var rec idempotency.Record
		err = t.waiting(ctx, wait, func(prefix string) error {
			return scanRecord(t.tx.QueryRowContext(ctx, prefix+t.s.st.readKey+` LOCK IN SHARE MODE`, nil, req.Key, req.Scope, req.Endpoint), &rec, nil)
		})
		switch {
		case err == nil:
			return idempotency.ClaimResult{Record: rec}, nil
		case !errors.Is(err, sql.ErrNoRows):
			return idempotency.ClaimResult{}, err
		}
	}
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: errClaimVanished}
}

// cmpWait is a lock wait, idempotency.DefaultTxLockWait for 0.
func cmpWait(d time.Duration) time.Duration {
	if d <= 0 {
		return idempotency.DefaultTxLockWait
	}
	return d
}

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
		r, err = t.tx.ExecContext(ctx, t.s.st.fail, f.ID, f.Scope, f.Attempt)
	} else {
		body, raw, headers, seal, cerr := completeArgs(s.Response)
		if cerr != nil {
			return cerr
		}
		if t.s.d.name == PostgreSQL {
			body, raw = pgJSONArgs(body, raw)
		}
		r, err = t.tx.ExecContext(ctx, t.s.st.complete, s.Response.Status, body, raw, headers, seal, f.ID, f.Scope, f.Attempt)
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
