package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
)

// routeTx is a Store's idempotency.RouteTx: a transaction on a
// connection taken from the pool explicitly, begun, committed and rolled
// back with statements sent under the store timeout (database/sql's
// Commit and Rollback take no context). On MySQL/MariaDB the connection is
// closed, never given back, when a handler had it: the server has no SET
// LOCAL and the driver does not reset a pooled connection, so whatever a
// handler set on its session (USE, SET SESSION sql_mode, time_zone,
// autocommit) would otherwise outlive the request. On PostgreSQL the
// session's settings and role are reset after the transaction instead
// (pgAfterEnd).
//
// Every method that uses the connection returns by its context's
// deadline (bounded): a call the driver cannot stop (lib/pq reads without
// a deadline once connected) is left to finish on its own, and the
// connection is closed when it does; the transaction is then lost, and
// nothing else touches it.
type routeTx struct {
	s     *Store
	c     *sql.Conn
	ended bool
	// lost: a call ran past its deadline and still runs; only bounded's
	// clean-up touches the connection, and the methods read nothing but
	// lost.
	lost bool
	// dirty: the session may have changed (the handler had it, or the
	// claim set its bounds), so on MySQL the connection is closed at the
	// end; a loser's connection, which nobody changed, goes back to the pool.
	dirty bool

	// waits counts down the claim's statements that may wait on a row
	// lock, shared by BeginClaim's tries (nil: no cap, a takeover):
	// TxLockWaitBudget's promise.
	waits *int

	tableHeld bool // MySQL: the transaction holds the table's metadata lock (holdTable)

	savedLock string    // PostgreSQL: the lock_timeout a bounded wait puts back
	bounds    [3]string // PostgreSQL: statement_timeout, idle_in_transaction_session_timeout and synchronous_commit as the claim found or set them

	lent *Tx // the handler's view, once lent

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
	type begun struct {
		t   *routeTx
		res idempotency.ClaimResult
	}
	b, err := bounded(ctx, func() (begun, error) {
		t, res, err := s.beginClaim(ctx, req)
		return begun{t, res}, err
	}, func(b begun, _ error) {
		if b.t != nil {
			b.t.discard() // the claim rolls back with the connection
		}
	})
	if err != nil {
		return nil, idempotency.ClaimResult{}, s.storeError("claim", err)
	}
	if b.t == nil {
		return nil, b.res, nil
	}
	return b.t, b.res, nil
}

// beginClaim is BeginClaim, unbounded.
func (s *Store) beginClaim(ctx context.Context, req *idempotency.ClaimRequest) (*routeTx, idempotency.ClaimResult, error) {
	last := errClaimVanished
	waits := retries
	for range retries {
		t, err := s.begin(ctx, req)
		if err != nil {
			return nil, idempotency.ClaimResult{}, s.storeError("begin", err)
		}
		if req == nil {
			return t, idempotency.ClaimResult{}, nil
		}
		t.waits = &waits
		res, err := t.claim(ctx, *req)
		switch {
		case err == nil:
			return t, res, nil
		case s.isLockWait(err):
			t.abort(ctx)
			return nil, idempotency.ClaimResult{}, nil
		case hasCode(err, s.d.restart...):
			last = err
		default:
			t.abort(ctx)
			return nil, idempotency.ClaimResult{}, s.storeError("claim", err)
		}
		t.abort(ctx)
		if err := ctx.Err(); err != nil {
			return nil, idempotency.ClaimResult{}, s.storeError("claim", err)
		}
	}
	return nil, idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: last}
}

// bounded runs f, which uses a connection, and returns its result, or
// ctx's error once ctx is done (and lostGrace more), whichever comes
// first. A call still running then (lib/pq does not return at a deadline
// on a link that answers nothing) is left to finish on its own: lost runs
// with its result when it does, to close the connection, and the error is
// errLost with ctx's.
func bounded[T any](ctx context.Context, f func() (T, error), lost func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	var r result
	select {
	case r = <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	// A driver that stops at the deadline (pgx's stdlib, go-sql-driver)
	// returns within moments, its connection closed: wait that long, so
	// that the caller's next step (a retry, a release) comes after the
	// close, as it would without bounded.
	grace := time.NewTimer(lostGrace)
	defer grace.Stop()
	select {
	case r = <-done:
		return r.v, r.err
	case <-grace.C:
	}
	go func() {
		r := <-done
		lost(r.v, r.err)
	}()
	var zero T
	return zero, fmt.Errorf("%w: %w", errLost, ctx.Err())
}

// run runs f on the transaction under ctx (bounded): past ctx's deadline
// the transaction is lost and its connection closed once f returns.
func (t *routeTx) run(ctx context.Context, f func() error) error {
	if t.lost {
		return fmt.Errorf("%w: %w", errLost, sql.ErrConnDone)
	}
	_, err := bounded(ctx, func() (struct{}, error) { return struct{}{}, f() }, func(struct{}, error) { t.discard() })
	if errors.Is(err, errLost) {
		t.lost = true
	}
	return err
}

// lostGrace is how long past its deadline bounded waits for a call before
// it leaves it to finish on its own.
const lostGrace = 50 * time.Millisecond

// errLost is a call that ran past its deadline and was left to finish on
// its own, and every later call on its transaction.
var errLost = errors.New("sqlstore: a call on the route's connection ran past its deadline; the transaction is lost")

// isLockWait reports a bounded wait on a row that ran out: InnoDB's lock
// wait (1205, MariaDB's no-wait tries included), a statement time limit
// (1969, 3024), PostgreSQL's lock_timeout (55P03) on a row (pgRowLockWait;
// one on the table, DDL or LOCK TABLE, is the store error of its code).
func (s *Store) isLockWait(err error) bool {
	var table *tableLockError
	switch {
	case errors.As(err, &table):
		return false // the table's lock: an outage, no owner to wait for
	case errors.Is(err, errWaitsSpent):
		return true
	}
	if s.d.name == PostgreSQL {
		return pgRowLockWait(err)
	}
	return hasCode(err, "1969", "1205", "3024")
}

// begin takes a connection and begins, with statements sent under ctx.
// On MySQL a run without a claim also turns autocommit off, so that
// nothing its handler runs after the server ended the transaction commits
// on its own (owned does the same for a claim, in mysqlBound's statement).
func (s *Store) begin(ctx context.Context, req *idempotency.ClaimRequest) (*routeTx, error) {
	c, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	t := &routeTx{s: s, c: c}
	stmts := []string{"BEGIN"}
	if s.d.name == MySQL {
		stmts = []string{"START TRANSACTION"}
		if req == nil {
			stmts, t.dirty = append(stmts, "SET SESSION autocommit = 0"), true
		}
	}
	for _, q := range stmts {
		if _, err := c.ExecContext(ctx, q); err != nil {
			t.discard()
			return nil, err
		}
	}
	return t, nil
}

// mysqlBound sets the session's idle bounds to the lease (the smaller
// wins, 0 counting as no bound), so that a vanished owner's connection,
// and the key's row lock with it, ends after about the lease instead of
// wait_timeout's 8 hours, and turns autocommit off: when InnoDB rolls the
// transaction back under the handler (a deadlock), a statement the lent
// Tx did not refuse begins a transaction nobody commits instead of
// committing on its own. Turning it off does
// not commit the open transaction. The connection is closed after the
// route, so nothing needs putting back.
func (s *Store) mysqlBound(ctx context.Context, c execer, lease time.Duration) error {
	secs := mysqlLockWaitSeconds(lease)
	q := `SET SESSION autocommit = 0, wait_timeout = LEAST(@@SESSION.wait_timeout, ?)`
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
// is tried again until it stops failing with 1205 or wait is over (the
// first 1205 runs holdTable, which tells the table's lock from a row's);
// on MySQL 8.0 holdTable runs first, under the same bound, then the
// session's innodb_lock_wait_timeout is set to wait (whole seconds, at
// least 1) and f runs once. The connection is closed after the route, so
// that setting never outlives it. Each call takes one of the claim's
// waits (mayWait), MySQL 8.0's probe another.
func (t *routeTx) waiting(ctx context.Context, wait time.Duration, f func(prefix string) error) error {
	if err := t.mayWait(); err != nil {
		return err
	}
	if !t.s.mariadb {
		t.dirty = true
		secs := mysqlLockWaitSeconds(wait)
		if !t.tableHeld { // the probe may wait too: it takes one of the claim's waits
			if err := t.mayWait(); err != nil {
				return err
			}
			if err := t.holdTable(ctx, fmt.Sprintf("/*+ SET_VAR(lock_wait_timeout=%d) */ ", secs)); err != nil {
				return err
			}
		}
		if _, err := t.c.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = ?`, secs); err != nil {
			return err
		}
		return f("")
	}
	deadline := time.Now().Add(wait)
	for {
		err := f(mariadbNoWait)
		if hasCode(err, "1205") {
			if herr := t.holdTable(ctx, mariadbNoWait); herr != nil {
				err = herr // the table's lock, or the probe's own failure
			}
		}
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
		if err := t.s.mysqlBound(ctx, t.c, lease); err != nil {
			return err
		}
	}
	_, err := t.c.ExecContext(ctx, t.s.st.savepoint)
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
			r, err = t.c.ExecContext(ctx, prefix+t.s.st.insert, t.s.insertArgs(req)...)
			return err
		})
		if err == nil {
			id, err := r.LastInsertId()
			if err != nil {
				return idempotency.ClaimResult{}, err
			}
			var rec idempotency.Record
			err = scanRecord(t.c.QueryRowContext(ctx, t.s.st.readID, id, req.Scope), &rec, nil)
			return idempotency.ClaimResult{Won: err == nil, Record: rec}, err
		}
		if !hasCode(err, t.s.d.duplicate...) {
			return idempotency.ClaimResult{}, err
		}
		var rec idempotency.Record
		err = t.waiting(ctx, wait, func(prefix string) error {
			return scanRecord(t.c.QueryRowContext(ctx, prefix+t.s.st.readKey+` LOCK IN SHARE MODE`, nil, req.Key, req.Scope, req.Endpoint), &rec, nil)
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

// errWaitsSpent is a claim whose tries used up its lock waits: contention,
// as a wait that ran out.
var errWaitsSpent = errors.New("sqlstore: the claim's lock waits are spent")

// mayWait takes one of the claim's lock waits, or returns errWaitsSpent.
func (t *routeTx) mayWait() error {
	if t.waits == nil {
		return nil
	}
	if *t.waits <= 0 {
		return errWaitsSpent
	}
	*t.waits--
	return nil
}

// TxLockWaitBudget returns how long one transactional claim with lock
// wait wait (RouteConfig.TxLockWait) may spend waiting on row locks: the
// claim runs at most 5 statements that may wait, across all its tries,
// each bounded by wait as the database applies it (whole milliseconds on
// PostgreSQL and MariaDB; whole seconds, at least 1s, on MySQL 8.0's
// innodb_lock_wait_timeout). The middleware calls it when it creates a
// transactional route and refuses one whose budget is not below
// Config.StoreTimeout, as it does for the pgx store.
func (s *Store) TxLockWaitBudget(wait time.Duration) time.Duration {
	return retries * lockWaitBound(s.d.name == MySQL && !s.mariadb, cmpWait(wait))
}

// lockWaitBound is one statement's bound on a row lock for wait: whole
// seconds, at least 1, where the server counts seconds (MySQL 8.0), whole
// milliseconds otherwise.
func lockWaitBound(seconds bool, wait time.Duration) time.Duration {
	if seconds {
		return time.Duration(mysqlLockWaitSeconds(wait)) * time.Second
	}
	return (wait + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// tableLockError is a claim's wait on the table's metadata lock (DDL, a
// migration, LOCK TABLES) that ran out: not contention on a row, so not
// 409 in flight, but the store error of its
// code (1205, lock_timeout), 503.
type tableLockError struct{ err error }

func (e *tableLockError) Error() string {
	return "the table's metadata lock is held (DDL, a migration, LOCK TABLES): " + e.err.Error()
}
func (e *tableLockError) Unwrap() error { return e.err }

// holdTable takes the table's metadata lock for the transaction once
// (tableProbe under prefix's bound), so that every later 1205 in it is a
// row's. A 1205 on the probe is a *tableLockError.
func (t *routeTx) holdTable(ctx context.Context, prefix string) error {
	if t.tableHeld {
		return nil
	}
	q := strings.ReplaceAll(tableProbe, "T_", t.s.table)
	if strings.HasPrefix(prefix, "/*+") { // MySQL 8.0: the hint follows SELECT
		q = "SELECT " + prefix + strings.TrimPrefix(q, "SELECT ")
	} else {
		q = prefix + q
	}
	rows, err := t.c.QueryContext(ctx, q)
	if err == nil {
		err = rows.Close()
	}
	switch {
	case err == nil:
		t.tableHeld = true
		return nil
	case hasCode(err, "1205"):
		return &tableLockError{err: err}
	}
	return err
}
