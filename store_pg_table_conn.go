package idempotency

// The connections and transactions of PostgresStore that qualify the table
// in what they send (store_pg_table.go).

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolConn names pgxpool's connection for embedding: embedded under its
// own name, its field would hide its Conn method.
type poolConn = pgxpool.Conn

// pgConn is a connection the store acquired (conn): pgxpool's, whose
// Query, QueryRow, Exec, SendBatch and Begin qualify what they send as
// pgPool's do.
type pgConn struct {
	*poolConn
	p *pgPool
}

// conn acquires a connection as acquire does, qualifying what is sent on it.
func (s *PostgresStore) conn(ctx context.Context) (pgConn, error) {
	c, err := s.acquire(ctx)
	if err != nil {
		return pgConn{}, err
	}
	return pgConn{c, s.pool}, nil
}

// release gives the connection back (release).
func (c pgConn) release() { release(c.poolConn) }

func (c pgConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return nil, err
	}
	return c.poolConn.Query(ctx, q.of(sql), args...)
}

func (c pgConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return errRow{err}
	}
	return c.poolConn.QueryRow(ctx, q.of(sql), args...)
}

func (c pgConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return c.poolConn.Exec(ctx, q.of(sql), args...)
}

func (c pgConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return errBatch{err}
	}
	q.batch(b)
	return c.poolConn.SendBatch(ctx, b)
}

func (c pgConn) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return nil, err
	}
	tx, err := c.poolConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return pgQualifiedTx{tx, q}, nil
}

func (c pgConn) Begin(ctx context.Context) (pgx.Tx, error) {
	q, err := c.p.resolved(ctx, c.poolConn)
	if err != nil {
		return nil, err
	}
	tx, err := c.poolConn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgQualifiedTx{tx, q}, nil
}

// pgQualifiedTx is a transaction of pgPool's: it qualifies what its Query,
// QueryRow, Exec and SendBatch send, as pgPool does, and so do its
// savepoints (Begin).
type pgQualifiedTx struct {
	pgx.Tx
	q *pgQualified
}

func (t pgQualifiedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, t.q.of(sql), args...)
}

func (t pgQualifiedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, t.q.of(sql), args...)
}

func (t pgQualifiedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, t.q.of(sql), args...)
}

func (t pgQualifiedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.q.batch(b)
	return t.Tx.SendBatch(ctx, b)
}

func (t pgQualifiedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgQualifiedTx{tx, t.q}, nil
}

// errRow is a row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is a batch that was never sent: every result is err.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
