package sqlstore

import (
	"context"
	"database/sql"
	"sync"

	"github.com/idemkit/idempotency"
)

// Tx is a transactional route's transaction as its handler sees it
// (TxFromContext). Write through it: the writes commit together with the
// key's completed record, or not at all. It has the methods of sqlc's DBTX
// and Bun's IConn, and is a GORM ConnPool that GORM treats as an open
// transaction (a nested db.Transaction is a savepoint).
//
// The middleware owns the transaction: Commit and Rollback return
// idempotency.ErrTxManaged and change nothing (answer >= 500 to roll the
// writes back). Every call is refused with sql.ErrTxDone once the handler
// has returned (QueryRowContext's Row then holds context.Canceled), and the
// middleware waits for calls still under way before it records; rows and
// statements the handler left open are closed then.
type Tx struct {
	tx *sql.Tx

	mu     sync.RWMutex // held shared by each call, exclusively by end
	closed bool         // under mu

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

// lend returns ctx carrying the handler's view of tx, and the function
// that ends the loan.
func lend(ctx context.Context, tx *sql.Tx) (context.Context, func()) {
	t := &Tx{tx: tx}
	return context.WithValue(ctx, txCtxKey{}, t), t.end
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

// enter begins a call: false once the loan ended.
func (t *Tx) enter() bool {
	t.mu.RLock()
	if t.closed {
		t.mu.RUnlock()
		return false
	}
	return true
}

func (t *Tx) leave() { t.mu.RUnlock() }

// keep notes c, to close at the end of the loan.
func (t *Tx) keep(c interface{ Close() error }) {
	t.openMu.Lock()
	t.open = append(t.open, c)
	t.openMu.Unlock()
}

// ExecContext runs a statement in the transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if !t.enter() {
		return nil, sql.ErrTxDone
	}
	defer t.leave()
	return t.tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query in the transaction. Rows left open when the
// handler returns are closed then.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if !t.enter() {
		return nil, sql.ErrTxDone
	}
	defer t.leave()
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err == nil {
		t.keep(rows)
	}
	return rows, err
}

// QueryRowContext runs a query expected to return at most one row.
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if !t.enter() {
		done, cancel := context.WithCancel(ctx)
		cancel() // the Row reports context.Canceled; the connection is not touched
		return t.tx.QueryRowContext(done, query, args...)
	}
	defer t.leave()
	return t.tx.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares a statement in the transaction. Statements left
// open when the handler returns are closed then.
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	if !t.enter() {
		return nil, sql.ErrTxDone
	}
	defer t.leave()
	st, err := t.tx.PrepareContext(ctx, query)
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

// Unwrap returns the underlying *sql.Tx, for libraries that need the
// concrete type (sqlx's NewTx). A handler that calls its Commit or
// Rollback gives up at-most-once: the key's claim commits or vanishes
// with it. The middleware detects it afterwards, logs an ERROR and records
// the answer with an ordinary fenced statement.
func (t *Tx) Unwrap() *sql.Tx { return t.tx }
