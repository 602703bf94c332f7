// Package idemsqlx is the sqlx recipe of the idempotency library's
// database/sql store (sqlstore): a transactional route's handler writes
// through sqlx on the route's transaction, so its rows commit together
// with the key's completed record, or not at all.
//
// FromContext gives the handler a Tx: sqlx's methods (GetContext,
// SelectContext, NamedExecContext, QueryxContext, Rebind, ...) on the
// route's *sqlstore.Tx, with the bindvars and field mapping of the
// program's *sqlx.DB. It is a sqlx.ExtContext, so sqlx's package
// functions (sqlx.GetContext(ctx, tx, ...), sqlx.NamedExecContext, ...)
// take it too. Its Commit and Rollback return idempotency.ErrTxManaged and
// change nothing: the middleware owns the transaction. Answer >= 500 to
// roll the handler's writes back; the key is then failed.
//
// Every method runs through the *sqlstore.Tx, which refuses a call made
// after the handler returned or after the server ended the transaction
// (QueryRowxContext reads its row there and hands out a *sqlx.Row that
// holds it, since sqlx builds a *sqlx.Row only from a query of its own).
package idemsqlx

import (
	"context"
	"database/sql"
	"errors"
	"reflect"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idempotency/sqlstore"
)

// Tx is a transactional route's transaction for sqlx, as its handler sees
// it.
type Tx struct {
	db *sqlx.DB
	tx *sqlstore.Tx
}

var _ sqlx.ExtContext = (*Tx)(nil)

// FromContext returns the transaction that a transactional route of a
// sqlstore.Store lent to ctx's handler, with db's driver name (its
// bindvars) and mapper (open db with sqlx.NewDb on the store's *sql.DB).
// It reports false outside such a route.
func FromContext(ctx context.Context, db *sqlx.DB) (*Tx, bool) {
	tx, ok := sqlstore.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	return &Tx{db: db, tx: tx}, true
}

// DriverName returns the driver name of the Tx's *sqlx.DB.
func (t *Tx) DriverName() string { return t.db.DriverName() }

// Rebind transforms a query from ? bindvars to the driver's.
func (t *Tx) Rebind(query string) string { return t.db.Rebind(query) }

// BindNamed binds a query with :name parameters from arg's fields or keys,
// in the driver's bindvars.
func (t *Tx) BindNamed(query string, arg any) (string, []any, error) {
	return t.db.BindNamed(query, arg)
}

// ExecContext runs a statement in the transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query in the transaction.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, query, args...)
}

// PrepareContext prepares a statement in the transaction.
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return t.tx.PrepareContext(ctx, query)
}

// QueryxContext runs a query in the transaction and returns sqlx's Rows.
func (t *Tx) QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &sqlx.Rows{Rows: rows, Mapper: t.db.Mapper}, nil
}

// QueryRowxContext runs a query expected to return at most one row. It
// reads the first row and closes the query before it returns (a Row never
// scanned holds the connection no longer), and the *sqlx.Row holds what
// it read, or the error (the refusal, once the loan or the transaction
// ended).
func (t *Tx) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	return readRow(ctx, t.tx, query, args...).rowx(t.db)
}

// GetContext scans the query's first row into dest (a struct by its db
// fields, or a scannable value), or returns sql.ErrNoRows. It reads
// through SelectContext, so it reads every row the query returns.
func (t *Tx) GetContext(ctx context.Context, dest any, query string, args ...any) error {
	v := reflect.ValueOf(dest)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return errors.New("idemsqlx: GetContext: dest must be a non-nil pointer")
	}
	all := reflect.New(reflect.SliceOf(v.Type().Elem()))
	if err := sqlx.SelectContext(ctx, t, all.Interface(), query, args...); err != nil {
		return err
	}
	if all.Elem().Len() == 0 {
		return sql.ErrNoRows
	}
	v.Elem().Set(all.Elem().Index(0))
	return nil
}

// SelectContext scans every row of the query into dest, a pointer to a
// slice.
func (t *Tx) SelectContext(ctx context.Context, dest any, query string, args ...any) error {
	return sqlx.SelectContext(ctx, t, dest, query, args...)
}

// NamedExecContext runs a statement with :name parameters bound from arg.
func (t *Tx) NamedExecContext(ctx context.Context, query string, arg any) (sql.Result, error) {
	return sqlx.NamedExecContext(ctx, t, query, arg)
}

// Commit is refused: the middleware commits the handler's writes together
// with the key's record. It returns idempotency.ErrTxManaged and changes
// nothing.
func (t *Tx) Commit() error { return t.tx.Commit() }

// Rollback is refused: answer >= 500 and the middleware rolls the writes
// back. It returns idempotency.ErrTxManaged and changes nothing.
func (t *Tx) Rollback() error { return t.tx.Rollback() }
