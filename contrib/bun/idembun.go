// Package idembun is the Bun recipe of the idempotency library's
// database/sql store (sqlstore): a transactional route's handler writes
// through Bun on the route's transaction, so its rows commit together with
// the key's completed record, or not at all.
//
// FromContext gives the handler a Tx: Bun's query builders with the
// route's *sqlstore.Tx as their bun.IConn (the Conn of each query). Its
// Commit and Rollback return idempotency.ErrTxManaged and change nothing:
// the middleware owns the transaction. Answer >= 500 to roll the handler's
// writes back; the key is then failed. Every call made after the handler
// returned is refused (sqlstore.Tx).
package idembun

import (
	"context"
	"database/sql"

	"github.com/uptrace/bun"

	"github.com/idemkit/idempotency/sqlstore"
)

// Tx is a transactional route's transaction for Bun, as its handler sees
// it. It is a bun.IConn, so any query takes it as Conn too; its New*
// methods build queries of its DB that run on it.
type Tx struct {
	db *bun.DB
	tx *sqlstore.Tx
}

var _ bun.IConn = Tx{}

// FromContext returns the transaction that a transactional route of a
// sqlstore.Store lent to ctx's handler, for queries of db (open db with
// the dialect of the store's database, for example
// bun.NewDB(sqlDB, mysqldialect.New()) on the store's *sql.DB). It reports
// false outside such a route.
func FromContext(ctx context.Context, db *bun.DB) (Tx, bool) {
	tx, ok := sqlstore.TxFromContext(ctx)
	if !ok {
		return Tx{}, false
	}
	return Tx{db: db, tx: tx}, true
}

// NewSelect returns a SELECT query of the transaction's DB on it.
func (t Tx) NewSelect() *bun.SelectQuery { return t.db.NewSelect().Conn(t.tx) }

// NewInsert returns an INSERT query of the transaction's DB on it.
func (t Tx) NewInsert() *bun.InsertQuery { return t.db.NewInsert().Conn(t.tx) }

// NewUpdate returns an UPDATE query of the transaction's DB on it.
func (t Tx) NewUpdate() *bun.UpdateQuery { return t.db.NewUpdate().Conn(t.tx) }

// NewDelete returns a DELETE query of the transaction's DB on it.
func (t Tx) NewDelete() *bun.DeleteQuery { return t.db.NewDelete().Conn(t.tx) }

// NewRaw returns a raw query of the transaction's DB on it.
func (t Tx) NewRaw(query string, args ...any) *bun.RawQuery {
	return t.db.NewRaw(query, args...).Conn(t.tx)
}

// ExecContext runs a statement in the transaction (bun.IConn).
func (t Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query in the transaction (bun.IConn).
func (t Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, query, args...)
}

// QueryRowContext runs a query expected to return at most one row in the
// transaction (bun.IConn).
func (t Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, query, args...)
}

// Commit is refused: the middleware commits the handler's writes together
// with the key's record. It returns idempotency.ErrTxManaged and changes
// nothing.
func (t Tx) Commit() error { return t.tx.Commit() }

// Rollback is refused: answer >= 500 and the middleware rolls the writes
// back. It returns idempotency.ErrTxManaged and changes nothing.
func (t Tx) Rollback() error { return t.tx.Rollback() }
