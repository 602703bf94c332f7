package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type ctxKey int

const (
	keyCtxKey ctxKey = iota
	txCtxKey
)

// KeyFromContext returns the request's normalised idempotency key inside a
// wrapped handler, for example to forward it to a broker as its client
// order id. It reports false when the request carried no key or the
// kill-switch was off.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey).(string)
	return k, ok
}

// withKey returns r with its idempotency key in the context.
func withKey(r *http.Request, key string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), keyCtxKey, key))
}

// TxFromContext returns the transaction a transactional route began for its
// handler. Write through it: the writes commit together with the key's
// completed record, or not at all. The middleware owns it: its Commit and
// Rollback return ErrTxManaged and change nothing (answer >= 500 to roll
// back); Begin opens a savepoint as usual. It reports false outside a
// transactional route.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txCtxKey).(pgx.Tx)
	return tx, ok
}

// ErrTxManaged is returned by Commit and Rollback on the transaction
// TxFromContext hands a handler: the middleware commits the handler's
// writes together with the key's record, or rolls them back, keeping the
// key's claim, when the handler failed.
var ErrTxManaged = errors.New("idempotency: the route's transaction is committed or rolled back by the middleware")

// handlerTx is the route's transaction as the handler sees it. Commit and
// Rollback of the route's own transaction are refused (ErrTxManaged); a
// savepoint the handler began (Begin) commits and rolls back as usual.
// Once the handler returned, every method is refused with pgx.ErrTxClosed
// (close): a handler that kept the transaction, or a savepoint of it, past
// its return cannot reach the connection, which may be back in the pool
// serving another request while pgx still counts the transaction open (its
// COMMIT went pipelined with the record, not through Commit). Conn, and a
// LargeObjects value taken during the handler, are pgx's own and not
// guarded: like the transaction, they must not outlive the handler.
type handlerTx struct {
	tx     pgx.Tx
	closed *atomic.Bool
	nested bool // a savepoint the handler began: Commit and Rollback are its own
	hooks  *txHooks
}

// txHooks are test hooks (export_tx_test.go), taken from the handler's
// context: call runs in a call of the handler's transaction once the call
// passed the check that the handler still runs; closeWait runs when
// closing must wait for calls under way.
type txHooks struct{ call, closeWait func() }

// txHooksKey is the context key of txHooks.
type txHooksKey struct{}

// closedTx is a transaction that refuses everything with pgx.ErrTxClosed:
// what a handlerTx delegates to once closed.
var closedTx = func() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}()

// withTx returns ctx carrying tx for the handler, and the function that
// closes the handler's view of it.
func withTx(ctx context.Context, tx pgx.Tx) (context.Context, func()) {
	closed := new(atomic.Bool)
	hooks, _ := ctx.Value(txHooksKey{}).(*txHooks)
	return context.WithValue(ctx, txCtxKey, pgx.Tx(&handlerTx{tx: tx, closed: closed, hooks: hooks})), func() { closed.Store(true) }
}

// t is the transaction to delegate to: closedTx once closed.
func (h *handlerTx) t() pgx.Tx {
	if h.closed.Load() {
		return closedTx
	}
	if h.hooks != nil && h.hooks.call != nil {
		h.hooks.call()
	}
	return h.tx
}

// Begin opens a savepoint, as pgx's Begin does.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := h.t().Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &handlerTx{tx: sp, closed: h.closed, nested: true, hooks: h.hooks}, nil
}

// Commit refuses on the route's transaction: the middleware commits,
// together with the record. On a savepoint it releases the savepoint.
func (h *handlerTx) Commit(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	return h.t().Commit(ctx)
}

// Rollback refuses on the route's transaction: answer >= 500 (or panic)
// and the middleware rolls back. On a savepoint it rolls back to it.
func (h *handlerTx) Rollback(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	return h.t().Rollback(ctx)
}

// CopyFrom delegates to the transaction.
func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return h.t().CopyFrom(ctx, table, columns, src)
}

// SendBatch delegates to the transaction.
func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return h.t().SendBatch(ctx, b)
}

// LargeObjects delegates to the transaction.
func (h *handlerTx) LargeObjects() pgx.LargeObjects { return h.t().LargeObjects() }

// Prepare delegates to the transaction.
func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return h.t().Prepare(ctx, name, sql)
}

// Exec delegates to the transaction.
func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return h.t().Exec(ctx, sql, args...)
}

// Query delegates to the transaction.
func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return h.t().Query(ctx, sql, args...)
}

// QueryRow delegates to the transaction.
func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return h.t().QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection (pgx's own, not guarded).
func (h *handlerTx) Conn() *pgx.Conn { return h.tx.Conn() }
