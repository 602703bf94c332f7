package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgStep is one statement of a transactional route's pipelined batch.
type pgStep struct {
	sql  string
	args []any
	// alone marks a SET LOCAL: under pgx's simple protocol, which sends a
	// batch as one multi-statement string (and Citus forwards such a
	// string whole), it is a query of its own.
	alone bool
}

// pgPipe sends steps as one pipelined batch or, on a connection in pgx's
// simple protocol, as a few: each alone step a batch of its own, the
// others grouped between them. Each next batch is sent once the previous
// one is read, and only if it succeeded, so an error skips what follows it
// as one pipeline's error would. It reads like one pgx.BatchResults. The
// table's name goes out qualified (pgQualified), whatever search_path the
// handler left.
type pgPipe struct {
	ctx  context.Context
	conn *pgx.Conn
	segs []*pgx.Batch
	br   pgx.BatchResults
	tx   pgx.Tx
	left int   // results left to read in br
	err  error // the first error of a batch, returned from then on
}

// sendPipe sends steps on conn, qualified by q, the first batch beginning
// a transaction when begin is set.
func sendPipe(ctx context.Context, conn *pgx.Conn, q *pgQualified, begin bool, steps ...pgStep) *pgPipe {
	simple := queryMode(conn) == pgx.QueryExecModeSimpleProtocol
	p := &pgPipe{ctx: ctx, conn: conn}
	b := &pgx.Batch{}
	if begin {
		b.BeginTx(pgx.TxOptions{})
	}
	for i, s := range steps {
		if simple && (s.alone || i > 0 && steps[i-1].alone) && b.Len() > 0 {
			p.segs = append(p.segs, b)
			b = &pgx.Batch{}
		}
		b.Queue(q.of(s.sql), s.args...)
	}
	p.segs = append(p.segs, b)
	p.send()
	if begin {
		p.tx = p.br.Tx()
	}
	return p
}

// send sends the next batch.
func (p *pgPipe) send() {
	b := p.segs[0]
	p.segs = p.segs[1:]
	p.br, p.left = p.conn.SendBatch(p.ctx, b), b.Len()
}

// next makes br the batch holding the next result: false once a batch
// failed.
func (p *pgPipe) next() bool {
	if p.err != nil {
		return false
	}
	if p.left == 0 && len(p.segs) > 0 {
		if p.err = p.br.Close(); p.err != nil {
			return false
		}
		p.send()
	}
	p.left--
	return true
}

// Tx is the transaction the first batch began.
func (p *pgPipe) Tx() pgx.Tx { return p.tx }

// Exec reads the next statement's result.
func (p *pgPipe) Exec() (pgconn.CommandTag, error) {
	if !p.next() {
		return pgconn.CommandTag{}, p.err
	}
	tag, err := p.br.Exec()
	p.fail(err)
	return tag, err
}

// Query reads the next statement's rows.
func (p *pgPipe) Query() (pgx.Rows, error) {
	if !p.next() {
		return pgx.FailedBatchResults(&pgx.Batch{}, p.err).Query()
	}
	rows, err := p.br.Query()
	p.fail(err)
	return rows, err
}

// QueryRow reads the next statement's row.
func (p *pgPipe) QueryRow() pgx.Row {
	if !p.next() {
		return pgx.FailedBatchResults(&pgx.Batch{}, p.err).QueryRow()
	}
	return p.br.QueryRow()
}

// fail keeps the first error of the current batch: the batches after it
// are never sent.
func (p *pgPipe) fail(err error) {
	if err != nil && p.err == nil {
		p.err = err
	}
}

// Close closes the current batch and returns the first error, the batches
// never sent dropped.
func (p *pgPipe) Close() error {
	err := p.br.Close()
	if p.err != nil {
		return p.err
	}
	return err
}

// modeKey is where a connection's CustomData keeps its query mode: pgx's
// Conn.Config copies the whole configuration.
const modeKey = "idempotency.query_mode"

// queryMode is conn's default query mode.
func queryMode(conn *pgx.Conn) pgx.QueryExecMode {
	data := conn.PgConn().CustomData()
	if m, ok := data[modeKey].(pgx.QueryExecMode); ok {
		return m
	}
	m := conn.Config().DefaultQueryExecMode
	data[modeKey] = m
	return m
}
