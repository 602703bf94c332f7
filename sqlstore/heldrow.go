package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
)

// A *sql.Row keeps its query's result open, and its connection busy, until
// Scan: a handler that reads only Row.Err() would leave the route's
// connection unusable for the record (a re-execution loop: 503, and the
// retry runs again). So the lent Tx reads the row itself, closes the
// query, and hands out a *sql.Row that holds what it read, served by a
// one-query database/sql pool of its own (database/sql builds a *sql.Row
// only from a query).

// heldRow is a query's first row as read, or its error.
type heldRow struct {
	cols []string
	vals []driver.Value // nil: no row
	err  error
}

// readRow runs query on c and reads its first row.
func readRow(ctx context.Context, c *sql.Conn, query string, args ...any) *heldRow {
	rows, err := c.QueryContext(ctx, query, args...)
	if err != nil {
		return &heldRow{err: err}
	}
	h := &heldRow{}
	if h.cols, err = rows.Columns(); err != nil {
		_ = rows.Close()
		return &heldRow{err: err}
	}
	if rows.Next() {
		vals := make([]any, len(h.cols))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i] // a *any receives the driver's value, []byte copied
		}
		if err := rows.Scan(ptrs...); err != nil {
			_ = rows.Close()
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

// row returns a *sql.Row holding h: Err and Scan report h.err, or Scan
// converts h's values into its destinations as database/sql converts a
// driver's (sql.ErrNoRows without a row).
func (h *heldRow) row() *sql.Row {
	db := sql.OpenDB(heldConnector{h})
	defer db.Close() // the Row keeps its own connection, closed by Scan
	return db.QueryRowContext(context.Background(), "")
}

// heldConnector, heldConn and heldRows are the driver that serves a
// heldRow.
type heldConnector struct{ h *heldRow }

func (c heldConnector) Connect(context.Context) (driver.Conn, error) { return heldConn(c), nil }
func (heldConnector) Driver() driver.Driver                          { return heldDriver{} }

type heldDriver struct{}

func (heldDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("sqlstore: the held row's driver opens no DSN")
}

type heldConn struct{ h *heldRow }

func (heldConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("sqlstore: the held row's driver prepares nothing")
}
func (heldConn) Close() error { return nil }
func (heldConn) Begin() (driver.Tx, error) {
	return nil, errors.New("sqlstore: the held row's driver begins nothing")
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
