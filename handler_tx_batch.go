package idempotency

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
