package idempotency

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The results a handler's transaction hands out (store_pg_lend.go), behind
// its gate: once the handler returned they refuse every call, and the
// gate closes those the handler left open. Reading them sends nothing, so
// they still read after the transaction ended (the rows of its COMMIT).

// gatedRows is a pgx.Rows of the handler's transaction.
type gatedRows struct {
	g         *txGate
	rows      pgx.Rows
	abandoned bool // closed by the gate, not by the handler
}

// rows returns rows behind the gate, tracked until closed.
func (g *txGate) rows(rows pgx.Rows) *gatedRows {
	r := &gatedRows{g: g, rows: rows}
	g.track(r)
	return r
}

func (r *gatedRows) abandon() {
	r.abandoned = true
	r.rows.Close()
}

// Close closes the rows.
func (r *gatedRows) Close() {
	if r.g.enterRead() != nil {
		return
	}
	defer r.g.leave()
	r.rows.Close()
	_ = r.g.note(r.rows.Err())
	r.g.untrack(r)
}

// Err is the rows' error; pgx.ErrTxClosed for rows the handler left open
// when it returned.
func (r *gatedRows) Err() error {
	if r.g.enterRead() != nil {
		if r.abandoned {
			return pgx.ErrTxClosed
		}
		return r.rows.Err()
	}
	defer r.g.leave()
	return r.g.note(r.rows.Err())
}

// CommandTag is the rows' command tag.
func (r *gatedRows) CommandTag() pgconn.CommandTag {
	if r.g.enterRead() != nil {
		return pgconn.CommandTag{}
	}
	defer r.g.leave()
	return r.rows.CommandTag()
}

// FieldDescriptions describes the rows' columns.
func (r *gatedRows) FieldDescriptions() []pgconn.FieldDescription {
	if r.g.enterRead() != nil {
		return nil
	}
	defer r.g.leave()
	return r.rows.FieldDescriptions()
}

// Next reads the next row.
func (r *gatedRows) Next() bool {
	if r.g.enterRead() != nil {
		return false
	}
	defer r.g.leave()
	if r.rows.Next() {
		return true
	}
	_ = r.g.note(r.rows.Err()) // the rows are done: an error of theirs is final
	return false
}

// Scan reads the current row into dest.
func (r *gatedRows) Scan(dest ...any) error {
	if r.g.enterRead() != nil {
		return pgx.ErrTxClosed
	}
	defer r.g.leave()
	return r.rows.Scan(dest...)
}

// Values returns the current row's values.
func (r *gatedRows) Values() ([]any, error) {
	if r.g.enterRead() != nil {
		return nil, pgx.ErrTxClosed
	}
	defer r.g.leave()
	return r.rows.Values()
}

// RawValues returns the current row's values as the server sent them.
func (r *gatedRows) RawValues() [][]byte {
	if r.g.enterRead() != nil {
		return nil
	}
	defer r.g.leave()
	return r.rows.RawValues()
}

// Conn returns the rows' connection (pgx's own, not guarded).
func (r *gatedRows) Conn() *pgx.Conn { return r.rows.Conn() }

// TypeMap returns the map the rows' values are decoded with.
func (r *gatedRows) TypeMap() *pgtype.Map { return r.rows.TypeMap() }

// gatedRow is a pgx.Row of the handler's transaction: Scan reads the one
// row as pgx's QueryRow does, and closes the rows.
type gatedRow struct{ rows pgx.Rows }

// Scan reads the row into dest: pgx.ErrNoRows when there is none.
func (r gatedRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			return fmt.Errorf("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// refusedRows are the rows of a call the gate refused: err, and nothing
// to read.
type refusedRows struct{ err error }

func (r refusedRows) Close()                                       {}
func (r refusedRows) Err() error                                   { return r.err }
func (r refusedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r refusedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r refusedRows) Next() bool                                   { return false }
func (r refusedRows) Scan(...any) error                            { return r.err }
func (r refusedRows) Values() ([]any, error)                       { return nil, r.err }
func (r refusedRows) RawValues() [][]byte                          { return nil }
func (r refusedRows) Conn() *pgx.Conn                              { return nil }
func (r refusedRows) TypeMap() *pgtype.Map                         { return nil }
