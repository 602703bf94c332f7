package idempotency

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The route's transaction as the handler sees it (TxFromContext). Once the
// handler returned, only the middleware may use the connection: it may be
// back in the pool serving another request while pgx still counts the
// transaction open (its COMMIT went pipelined with the record, not through
// Commit). So every call goes through a gate: a call holds it for its
// duration, and closing (when the handler returned) waits for the calls
// under way, then refuses every later one with pgx.ErrTxClosed, and closes
// what the handler left open (a pgx.Rows, a QueryRow never scanned, a
// batch), which would otherwise keep the connection busy and fail the
// record. Conn, and a LargeObjects value taken during the handler, are
// pgx's own and not guarded: like the transaction, they must not outlive
// the handler.

// txGate is the gate of one handler's transaction and of its savepoints.
type txGate struct {
	mu     sync.RWMutex // held shared by each call, exclusively by close
	closed bool         // under mu
	hooks  *txHooks

	openMu sync.Mutex
	open   []gatedResult // not closed yet, in the order they were opened
}

// gatedResult is a result the handler may leave open: gatedRows or
// gatedBatch.
type gatedResult interface {
	// abandon closes the result the handler left open; the gate is
	// closed and held.
	abandon()
}

// txHooks are test hooks (export_tx_test.go), taken from the handler's
// context: call runs in a call of the handler's transaction once the call
// passed the check that the handler still runs; closeWait runs when
// closing must wait for calls under way.
type txHooks struct{ call, closeWait func() }

// txHooksKey is the context key of txHooks.
type txHooksKey struct{}

// withTx returns ctx carrying tx for the handler, and the function that
// closes the handler's view of it.
func withTx(ctx context.Context, tx pgx.Tx) (context.Context, func()) {
	g := &txGate{}
	g.hooks, _ = ctx.Value(txHooksKey{}).(*txHooks)
	return context.WithValue(ctx, txCtxKey, pgx.Tx(&handlerTx{tx: tx, g: g})), g.close
}

// enter begins a call: false once the gate is closed, else the caller
// must leave.
func (g *txGate) enter() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	if g.hooks != nil && g.hooks.call != nil {
		g.hooks.call()
	}
	return true
}

// leave ends a call.
func (g *txGate) leave() { g.mu.RUnlock() }

// close waits for the calls under way, refuses every later one, and
// closes, last opened first, what the handler left open.
func (g *txGate) close() {
	if !g.mu.TryLock() {
		if g.hooks != nil && g.hooks.closeWait != nil {
			g.hooks.closeWait()
		}
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	g.closed = true
	g.openMu.Lock()
	open := g.open
	g.open = nil
	g.openMu.Unlock()
	for i := len(open) - 1; i >= 0; i-- {
		open[i].abandon()
	}
}

// track records r as open until it is closed.
func (g *txGate) track(r gatedResult) {
	g.openMu.Lock()
	defer g.openMu.Unlock()
	g.open = append(g.open, r)
}

// untrack forgets r, closed by the handler.
func (g *txGate) untrack(r gatedResult) {
	g.openMu.Lock()
	defer g.openMu.Unlock()
	for i, o := range g.open {
		if o == r {
			g.open = append(g.open[:i], g.open[i+1:]...)
			return
		}
	}
}

// closedTx is a transaction that refuses everything with pgx.ErrTxClosed:
// what a handlerTx answers with once closed.
var closedTx = func() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}()

// handlerTx is the route's transaction, or a savepoint the handler began
// (nested), behind the gate. Commit and Rollback of the route's own
// transaction are refused (ErrTxManaged); a savepoint's commit and roll
// back as usual.
type handlerTx struct {
	tx     pgx.Tx
	g      *txGate
	nested bool
}

// Begin opens a savepoint, as pgx's Begin does.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !h.g.enter() {
		return closedTx.Begin(ctx)
	}
	defer h.g.leave()
	sp, err := h.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &handlerTx{tx: sp, g: h.g, nested: true}, nil
}

// Commit refuses on the route's transaction: the middleware commits,
// together with the record. On a savepoint it releases the savepoint.
func (h *handlerTx) Commit(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	if !h.g.enter() {
		return closedTx.Commit(ctx)
	}
	defer h.g.leave()
	return h.tx.Commit(ctx)
}

// Rollback refuses on the route's transaction: answer >= 500 (or panic)
// and the middleware rolls back. On a savepoint it rolls back to it.
func (h *handlerTx) Rollback(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	if !h.g.enter() {
		return closedTx.Rollback(ctx)
	}
	defer h.g.leave()
	return h.tx.Rollback(ctx)
}

// CopyFrom delegates to the transaction.
func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if !h.g.enter() {
		return closedTx.CopyFrom(ctx, table, columns, src)
	}
	defer h.g.leave()
	return h.tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch delegates to the transaction; the results are gated.
func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !h.g.enter() {
		return closedTx.SendBatch(ctx, b)
	}
	defer h.g.leave()
	r := &gatedBatch{g: h.g, batch: h.tx.SendBatch(ctx, b)}
	h.g.track(r)
	return r
}

// LargeObjects delegates to the transaction (pgx's own from then on).
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	if !h.g.enter() {
		return closedTx.LargeObjects()
	}
	defer h.g.leave()
	return h.tx.LargeObjects()
}

// Prepare delegates to the transaction.
func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if !h.g.enter() {
		return closedTx.Prepare(ctx, name, sql)
	}
	defer h.g.leave()
	return h.tx.Prepare(ctx, name, sql)
}

// Exec delegates to the transaction.
func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !h.g.enter() {
		return closedTx.Exec(ctx, sql, args...)
	}
	defer h.g.leave()
	return h.tx.Exec(ctx, sql, args...)
}

// Query delegates to the transaction; the rows are gated.
func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !h.g.enter() {
		return closedTx.Query(ctx, sql, args...)
	}
	defer h.g.leave()
	rows, err := h.tx.Query(ctx, sql, args...)
	return h.g.rows(rows), err
}

// QueryRow delegates to the transaction; the row is gated, and closed
// when the handler returned without scanning it.
func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, _ := h.Query(ctx, sql, args...) // the error is the row's too
	return gatedRow{rows}
}

// Conn returns the transaction's connection (pgx's own, not guarded).
func (h *handlerTx) Conn() *pgx.Conn { return h.tx.Conn() }
