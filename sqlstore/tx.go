package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idempotency"
)

// Tx is a transactional route's transaction as its handler sees it
// (TxFromContext). Write through it: the writes commit together with the
// key's completed record, or not at all. It has the methods of sqlc's DBTX
// and Bun's IConn, and is a GORM ConnPool that GORM treats as an open
// transaction (a nested db.Transaction is a savepoint); sqlx's recipe
// (contrib/sqlx) wraps it.
//
// The middleware owns the transaction: Commit and Rollback return
// idempotency.ErrTxManaged and change nothing (answer >= 500 to roll the
// writes back). Every call is refused, and sends nothing, once the handler
// has returned (sql.ErrTxDone), or once a call ended the transaction (an
// error that errors.Is idempotency.ErrTxEnded and sql.ErrTxDone): it
// failed in a way that ends it on the server (MySQL: a deadlock, 1213, or
// a lock wait, 1205, which InnoDB may answer by rolling the transaction
// back; PostgreSQL: a deadlock or a serialization failure, class 40; a
// lost connection on either), or it ran COMMIT or ROLLBACK itself, or DDL
// that commits implicitly (the connection reports no transaction; read
// from pgx's stdlib, lib/pq and go-sql-driver). So nothing the handler
// runs afterwards runs outside the claim's transaction, and the client
// gets 503. The middleware waits for calls still under way before it
// records; rows and statements the handler left open are closed then.
// QueryRowContext reads its row before it returns, so a Row that is never
// scanned holds nothing open.
type Tx struct {
	c    *sql.Conn
	ends func(error) idempotency.TxState // how an error left the transaction: TxOpen, or ended (TxEnded, TxClosed)
	idle func() bool                     // reports a connection outside any transaction (txIdle)

	mu     sync.RWMutex // held shared by each call, exclusively by end
	closed bool         // under mu

	endedMu sync.Mutex
	ended   error               // what ended the transaction under the handler, under endedMu
	endedAs idempotency.TxState // TxClosed: the connection is gone; TxEnded: the server or the handler's own SQL ended it

	openMu sync.Mutex
	open   []interface{ Close() error } // rows and statements not closed by the handler
}

// txCtxKey is the context key of the handler's *Tx.
type txCtxKey struct{}

// TxFromContext returns the transaction a transactional route of a Store
// began for its handler. It reports false outside such a route.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	t, ok := ctx.Value(txCtxKey{}).(*Tx)
	return t, ok
}

// lend returns ctx carrying the handler's view of the transaction on c,
// and that view; ends reports the errors that end the transaction, idle
// (nil: none) a connection outside any transaction.
func lend(ctx context.Context, c *sql.Conn, ends func(error) idempotency.TxState, idle func() bool) (context.Context, *Tx) {
	t := &Tx{c: c, ends: ends, idle: idle}
	return context.WithValue(ctx, txCtxKey{}, t), t
}

// end waits for the calls under way, refuses every later one, and closes
// what the handler left open.
func (t *Tx) end() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.openMu.Lock()
	open := t.open
	t.open = nil
	t.openMu.Unlock()
	for i := len(open) - 1; i >= 0; i-- {
		_ = open[i].Close()
	}
}

// endedBy returns how the transaction ended under the handler (TxClosed,
// TxEnded) and what ended it, or a nil error.
func (t *Tx) endedBy() (idempotency.TxState, error) {
	t.endedMu.Lock()
	defer t.endedMu.Unlock()
	return t.endedAs, t.ended
}

// endAs notes that err ended the transaction, as state; the first cause
// stays.
func (t *Tx) endAs(err error, state idempotency.TxState) {
	t.endedMu.Lock()
	if t.ended == nil {
		t.ended, t.endedAs = err, state
	}
	t.endedMu.Unlock()
}

// errHandlerEnded is a transaction the handler ended with its own SQL.
var errHandlerEnded = errors.New("the handler ran COMMIT or ROLLBACK itself")

// enter begins a call: nil, or the refusal once the loan or the
// transaction ended (then the call is not under way).
func (t *Tx) enter() error {
	t.mu.RLock()
	if t.closed {
		t.mu.RUnlock()
		return sql.ErrTxDone
	}
	if _, err := t.endedBy(); err != nil {
		t.mu.RUnlock()
		// The cause is named, not wrapped: a handler that retries on a
		// deadlock must not see one in the refusal.
		return fmt.Errorf("sqlstore: %w (%v): %w", idempotency.ErrTxEnded, err, sql.ErrTxDone)
	}
	return nil
}

// leave ends a call, noting an error that ended the transaction, or a
// transaction the call itself ended (the connection is idle).
func (t *Tx) leave(err error) {
	switch {
	case err != nil && t.ends(err) != idempotency.TxOpen:
		t.endAs(err, t.ends(err))
	case t.idle != nil && t.idle():
		t.endAs(errHandlerEnded, idempotency.TxEnded)
	}
	t.mu.RUnlock()
}

// keep notes c, to close at the end of the loan.
func (t *Tx) keep(c interface{ Close() error }) {
	t.openMu.Lock()
	t.open = append(t.open, c)
	t.openMu.Unlock()
}

// ExecContext runs a statement in the transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (r sql.Result, err error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer func() { t.leave(err) }()
	return t.c.ExecContext(ctx, query, args...)
}

// QueryContext runs a query in the transaction. Rows left open when the
// handler returns are closed then.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (rows *sql.Rows, err error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer func() { t.leave(err) }()
	rows, err = t.c.QueryContext(ctx, query, args...)
	if err == nil {
		t.keep(rows)
	}
	return rows, err
}

// QueryRowContext runs a query expected to return at most one row. It
// reads the first row and closes the query before it returns, so the
// connection is free whether or not the Row is scanned; a refused call's
// Row holds the refusal.
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if err := t.enter(); err != nil {
		return (&heldRow{err: err}).row()
	}
	h := readRow(ctx, t.c, query, args...)
	t.leave(h.err)
	return h.row()
}

// PrepareContext prepares a statement in the transaction. Statements left
// open when the handler returns are closed then. Scan or close every row a
// statement returns: the statement's calls are not refused once the
// transaction ended.
func (t *Tx) PrepareContext(ctx context.Context, query string) (st *sql.Stmt, err error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer func() { t.leave(err) }()
	st, err = t.c.PrepareContext(ctx, query)
	if err == nil {
		t.keep(st)
	}
	return st, err
}

// Commit is refused: the middleware commits the handler's writes together
// with the key's record. It returns idempotency.ErrTxManaged and changes
// nothing.
func (t *Tx) Commit() error { return idempotency.ErrTxManaged }

// Rollback is refused: answer >= 500 and the middleware rolls the writes
// back, keeping the key's claim. It returns idempotency.ErrTxManaged and
// changes nothing.
func (t *Tx) Rollback() error { return idempotency.ErrTxManaged }
