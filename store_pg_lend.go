package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The lent transaction: the pgx.Tx a transactional route's handler gets
// (TxFromContext), gated so that it never outlives the handler.

// TxFromContext returns the transaction of a transactional route's handler
// (false elsewhere): its writes commit with the key's record, or not at
// all. Commit and Rollback return ErrTxManaged (answer >= 500 to roll back);
// Begin opens a savepoint. Each call runs one statement, and once the
// transaction ended under the handler every call returns ErrTxEnded.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txCtxKey).(pgx.Tx)
	return tx, ok
}

// ErrTxManaged is returned by Commit and Rollback of the transaction
// TxFromContext hands a handler: the middleware ends it.
var ErrTxManaged = errors.New("idempotency: the route's transaction is committed or rolled back by the middleware")

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
//
// No statement of the handler runs outside the transaction that holds its
// key: each call is exactly one statement,
// never sent over the simple protocol, where one string may hold several
// (a ROLLBACK, then writes that would commit on their own), and a batch
// runs one statement at a time (gatedBatch). After every call the
// gate reads the connection's transaction status; once the transaction has
// ended (the handler's own COMMIT or ROLLBACK), every later call returns
// ErrTxEnded and sends nothing.

// txGate is the gate of one handler's transaction and of its savepoints.
type txGate struct {
	mu     sync.RWMutex // held shared by each call, exclusively by close
	closed bool         // under mu
	hooks  *txHooks
	pc     *pgconn.PgConn
	ended  atomic.Bool // the transaction ended under the handler

	openMu sync.Mutex
	open   []gatedResult // not closed yet, in the order they were opened
}

// gatedResult is a result the handler may leave open: gatedRows. (A
// gatedBatch has nothing open: its statements run one at a time.)
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

// withTx returns ctx carrying tx for the handler, and the gate whose close
// ends the handler's view of it.
func withTx(ctx context.Context, tx pgx.Tx) (context.Context, *txGate) {
	g := &txGate{pc: tx.Conn().PgConn()}
	g.hooks, _ = ctx.Value(txHooksKey{}).(*txHooks)
	return context.WithValue(ctx, txCtxKey, pgx.Tx(&handlerTx{tx: tx, g: g})), g
}

// enter begins a call that sends a statement: pgx.ErrTxClosed once the
// gate is closed, ErrTxEnded once the transaction ended; nil, and the
// caller must leave.
func (g *txGate) enter() error {
	if err := g.enterRead(); err != nil {
		return err
	}
	if g.ended.Load() {
		g.mu.RUnlock()
		return ErrTxEnded
	}
	return nil
}

// enterRead begins a call that only reads what was sent already (a
// result's rows): pgx.ErrTxClosed once the gate is closed; nil, and the
// caller must leave.
func (g *txGate) enterRead() error {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return pgx.ErrTxClosed
	}
	if g.hooks != nil && g.hooks.call != nil {
		g.hooks.call()
	}
	return nil
}

// leave ends a call, noting whether the transaction ended with it: the
// server reports no transaction open ('I') once a COMMIT or ROLLBACK ran.
func (g *txGate) leave() {
	if g.pc.TxStatus() == 'I' {
		g.ended.Store(true)
	}
	g.mu.RUnlock()
}

// note returns err, first noting a transaction the server rolled back: a
// class-40 error (a deadlock, a serialization failure) leaves a
// transaction that can only be rolled back, so the handler's work is
// lost whatever it answers next, and the transaction counts as ended
// under it (every later call ErrTxEnded; the answer 503), as on every
// store (sqlstore does the same, and InnoDB rolls such a transaction back
// itself).
func (g *txGate) note(err error) error {
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "40") {
		g.ended.Store(true)
	}
	return err
}

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
// the LargeObjects of a handlerTx that refuses calls.
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
	if err := h.g.enter(); err != nil {
		return nil, err
	}
	defer h.g.leave()
	sp, err := h.tx.Begin(ctx)
	if err != nil {
		return nil, h.g.note(err)
	}
	return &handlerTx{tx: sp, g: h.g, nested: true}, nil
}

// Commit refuses on the route's transaction: the middleware commits,
// together with the record. On a savepoint it releases the savepoint.
func (h *handlerTx) Commit(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	if err := h.g.enter(); err != nil {
		return err
	}
	defer h.g.leave()
	return h.g.note(h.tx.Commit(ctx))
}

// Rollback refuses on the route's transaction: answer >= 500 (or panic)
// and the middleware rolls back. On a savepoint it rolls back to it.
func (h *handlerTx) Rollback(ctx context.Context) error {
	if !h.nested {
		return ErrTxManaged
	}
	if err := h.g.enter(); err != nil {
		return err
	}
	defer h.g.leave()
	return h.g.note(h.tx.Rollback(ctx))
}

// CopyFrom delegates to the transaction.
func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := h.g.enter(); err != nil {
		return 0, err
	}
	defer h.g.leave()
	n, err := h.tx.CopyFrom(ctx, table, columns, src)
	return n, h.g.note(err)
}

// SendBatch runs the batch's statements one at a time, each as Exec or
// Query runs it, as the handler reads their results (Close runs the rest):
// a batch sent whole would run what follows a COMMIT in it on its own.
func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := h.g.enter(); err != nil {
		return &gatedBatch{b: b, err: err}
	}
	h.g.leave()
	return &gatedBatch{h: h, ctx: ctx, b: b}
}

// LargeObjects delegates to the transaction (pgx's own from then on).
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	if err := h.g.enter(); err != nil {
		return closedTx.LargeObjects()
	}
	defer h.g.leave()
	return h.tx.LargeObjects()
}

// Prepare delegates to the transaction.
func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := h.g.enter(); err != nil {
		return nil, err
	}
	defer h.g.leave()
	sd, err := h.tx.Prepare(ctx, name, sql)
	return sd, h.g.note(err)
}

// Exec runs one statement in the transaction, over the extended protocol
// (oneStatement). pgx sends an Exec without arguments over the simple
// protocol whatever the mode, so such a call goes through Query in
// QueryExecModeExec instead: PgConn().ExecParams, with pgx's tracer and its
// prepared statements (a name the handler prepared still runs).
func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	if err := h.g.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer h.g.leave()
	defer func() { err = h.g.note(err) }()
	sql, args, n, err := oneStatement(ctx, h.tx.Conn(), sql, args)
	switch {
	case err != nil:
		return pgconn.CommandTag{}, err
	case n > 0:
		return h.tx.Exec(ctx, sql, args...)
	}
	rows, err := h.tx.Query(ctx, sql, pgx.QueryExecModeExec)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}

// Query runs one statement in the transaction (oneStatement); the rows
// are gated.
func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := h.g.enter(); err != nil {
		return refusedRows{err}, err
	}
	defer h.g.leave()
	sql, args, _, err := oneStatement(ctx, h.tx.Conn(), sql, args)
	if err != nil {
		return refusedRows{err}, err
	}
	rows, err := h.tx.Query(ctx, sql, args...)
	return h.g.rows(rows), h.g.note(err)
}

// QueryRow runs one statement in the transaction; the row is gated, and
// closed when the handler returned without scanning it.
func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, _ := h.Query(ctx, sql, args...) // the error is the row's too
	return gatedRow{rows}
}

// Conn returns the transaction's connection (pgx's own, not guarded).
func (h *handlerTx) Conn() *pgx.Conn { return h.tx.Conn() }

// oneStatement returns a call's sql and arguments as the lent transaction
// sends them, and how many arguments the statement has: never over the
// simple protocol (the call's mode, or the connection's default), which
// would send the string as it is, several statements and all; the
// extended protocol's QueryExecModeExec instead, which refuses several
// statements in one string (42601). A QueryRewriter (pgx.NamedArgs) is
// applied here, so that n counts what the statement is sent with.
func oneStatement(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, int, error) {
	mode, n := queryMode(conn), 0
	var rw pgx.QueryRewriter
options:
	for ; n < len(args); n++ {
		switch a := args[n].(type) {
		case pgx.QueryExecMode:
			mode = a
		case pgx.QueryRewriter:
			rw = a
		case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		default:
			break options
		}
	}
	if rw == nil && mode != pgx.QueryExecModeSimpleProtocol {
		return sql, args, len(args) - n, nil
	}
	opts, rest := args[:n], args[n:]
	if rw != nil {
		var err error
		if sql, rest, err = rw.RewriteQuery(ctx, conn, sql, rest); err != nil {
			return "", nil, 0, fmt.Errorf("rewrite query failed: %w", err)
		}
	}
	if mode == pgx.QueryExecModeSimpleProtocol {
		mode = pgx.QueryExecModeExec
	}
	out := make([]any, 0, len(opts)+1+len(rest))
	for _, o := range opts {
		switch o.(type) {
		case pgx.QueryExecMode, pgx.QueryRewriter:
		default:
			out = append(out, o)
		}
	}
	out = append(append(out, mode), rest...)
	return sql, out, len(rest), nil
}

// gatedBatch is a pgx.BatchResults of the handler's transaction. Its
// statements run one at a time, each through the handler's Exec or Query
// (so each is one statement, refused once the transaction ended), when the
// handler reads its result; Close runs those not read yet. pgx would send
// the batch whole, in one pipeline, where a statement after a COMMIT in it
// runs and commits on its own. The first error ends the batch, as in pgx:
// every later result returns it and nothing more is sent.
type gatedBatch struct {
	h    *handlerTx // nil when the gate refused the batch (err)
	ctx  context.Context
	b    *pgx.Batch
	next int   // the next statement of b to run
	err  error // the batch's first error: the rest is not run
}

// errNoMoreResults is pgx's error for reading past a batch's last result.
var errNoMoreResults = errors.New("no more results in batch")

// advance returns the next statement to run, or the batch's error.
func (b *gatedBatch) advance() (*pgx.QueuedQuery, error) {
	switch {
	case b.err != nil:
		return nil, b.err
	case b.next >= len(b.b.QueuedQueries):
		return nil, errNoMoreResults
	}
	b.next++
	return b.b.QueuedQueries[b.next-1], nil
}

// Exec runs the next statement.
func (b *gatedBatch) Exec() (pgconn.CommandTag, error) {
	qq, err := b.advance()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := b.h.Exec(b.ctx, qq.SQL, qq.Arguments...)
	b.err = err
	return tag, err
}

// Query runs the next statement; its rows are gated.
func (b *gatedBatch) Query() (pgx.Rows, error) {
	qq, err := b.advance()
	if err != nil {
		return refusedRows{err}, err
	}
	rows, err := b.h.Query(b.ctx, qq.SQL, qq.Arguments...)
	b.err = err
	return rows, err
}

// QueryRow runs the next statement; its row is gated.
func (b *gatedBatch) QueryRow() pgx.Row {
	rows, _ := b.Query() // the error is the row's too
	return gatedRow{rows}
}

// Close runs the statements not read yet (each queued function, or Exec)
// and returns the batch's first error.
func (b *gatedBatch) Close() error {
	for b.err == nil && b.next < len(b.b.QueuedQueries) {
		at := b.next
		if fn := b.b.QueuedQueries[at].Fn; fn != nil {
			if err := fn(b); err != nil && b.err == nil {
				b.err = err
			}
		}
		if b.next == at { // no function, or one that read nothing
			_, _ = b.Exec()
		}
	}
	return b.err
}

// Tx is nil: a batch sent in a transaction cannot begin one.
func (b *gatedBatch) Tx() pgx.Tx { return nil }
