package idemsqlx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idempotency/sqlstore"
)

// heldRow is a query's first row as read through the route's transaction,
// or its error. sqlx builds a *sqlx.Row only from a query of its own, so
// rowx serves the row from a one-query database/sql pool.
type heldRow struct {
	cols []string
	vals []driver.Value // nil: no row
	err  error
}

// readRow runs query on tx and reads its first row.
func readRow(ctx context.Context, tx *sqlstore.Tx, query string, args ...any) *heldRow {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return &heldRow{err: err}
	}
	defer rows.Close()
	h := &heldRow{}
	if h.cols, err = rows.Columns(); err != nil {
		return &heldRow{err: err}
	}
	if rows.Next() {
		vals := make([]any, len(h.cols))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i] // a *any receives the driver's value, []byte copied
		}
		if err := rows.Scan(ptrs...); err != nil {
			return &heldRow{err: err}
		}
		h.vals = make([]driver.Value, len(vals))
		for i, v := range vals {
			h.vals[i] = v
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return &heldRow{err: err}
	}
	return h
}

// rowx returns a *sqlx.Row holding h, with db's mapper.
func (h *heldRow) rowx(db *sqlx.DB) *sqlx.Row {
	held := sql.OpenDB(heldConnector{h})
	defer held.Close() // the Row keeps its own connection, closed by Scan
	x := sqlx.NewDb(held, db.DriverName())
	x.Mapper = db.Mapper
	return x.QueryRowxContext(context.Background(), "")
}

// heldConnector, heldConn and heldRows are the driver that serves a
// heldRow.
type heldConnector struct{ h *heldRow }

func (c heldConnector) Connect(context.Context) (driver.Conn, error) { return heldConn(c), nil }
func (heldConnector) Driver() driver.Driver                          { return heldDriver{} }

type heldDriver struct{}

func (heldDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("idemsqlx: the held row's driver opens no DSN")
}

type heldConn struct{ h *heldRow }

func (heldConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("idemsqlx: the held row's driver prepares nothing")
}
func (heldConn) Close() error { return nil }
func (heldConn) Begin() (driver.Tx, error) {
	return nil, errors.New("idemsqlx: the held row's driver begins nothing")
}

// QueryContext implements driver.QueryerContext: the held row.
func (c heldConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	if c.h.err != nil {
		return nil, c.h.err
	}
	return &heldRows{h: c.h}, nil
}

type heldRows struct {
	h    *heldRow
	done bool
}

func (r *heldRows) Columns() []string { return r.h.cols }
func (r *heldRows) Close() error      { return nil }
func (r *heldRows) Next(dest []driver.Value) error {
	if r.done || r.h.vals == nil {
		return io.EOF
	}
	r.done = true
	copy(dest, r.h.vals)
	return nil
}
