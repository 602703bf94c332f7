package idempotency

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The route transaction's claim (BeginClaim): BEGIN, the session's
// state, the lock wait and the claim, pipelined in one round trip.

var _ TxStore = (*PostgresStore)(nil)

// BeginClaim implements TxStore in one pipelined round trip.
func (s *PostgresStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	// One batch of BEGIN (pgx's Batch.BeginTx), the session's state read with
	// the claim's bounds, the claim and the savepoint; a loser then reads the
	// existing row (pgsql.TxReadSQL). A serialization failure or a lock wait
	// that ran out rolls back and begins again, a bounded number of times.
	if req == nil {
		t, _, err := s.begin(ctx, nil, "", "")
		if err != nil {
			return nil, ClaimResult{}, pgStoreError("begin", err)
		}
		return t, ClaimResult{}, nil
	}
	// A serialization failure comes at REPEATABLE READ or SERIALIZABLE,
	// when the owner the claim waited for commits. A lock wait that ran
	// out on no row is brief (another claim's insertion of the key in
	// progress, the table's extension) or the table's (DDL, a migration),
	// which outlasts every try: an outage.
	wait, lease := pgInterval(cmpWait(req.LockWait)), pgInterval(req.Lease)
	var last error
	for range pgRetries {
		t, res, err := s.begin(ctx, req, wait, lease)
		switch {
		case t == nil:
			return nil, ClaimResult{}, beginFailed(err)
		case err == nil:
			return t, res, nil
		case errors.As(err, new(rowLockWait)):
			// Contention, not a store error: another open transaction
			// holds the key (its owner is mid-handler).
			t.end(ctx)
			return nil, ClaimResult{}, nil
		case errors.Is(err, pgx.ErrNoRows):
			last = errClaimVanished
		case isRetryable(err), isLockWait(err):
			last = err
		default:
			t.end(ctx)
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
		t.end(ctx)
		if err := ctx.Err(); err != nil {
			return nil, ClaimResult{}, pgStoreError("claim", err)
		}
	}
	if isLockWait(last) {
		return nil, ClaimResult{}, pgStoreError("claim", last)
	}
	return nil, ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// beginFailed is the error of a claim's batch that failed before BEGIN
// took effect. A server error there is the claim's (its statements are
// prepared before the batch runs: a missing table, say); BEGIN itself
// fails only with the connection.
func beginFailed(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgStoreError("claim", err)
	}
	return pgStoreError("begin", err)
}

// begin takes a connection and sends BEGIN and the session's state read
// (pgsql.TxSessionSQL, or pgsql.TxBoundsSQL with the claim's bounds), pipelined
// with req's claim (nil: no claim). Each of the store's statements in the
// transaction names the table qualified (pgPool.resolved, on this
// connection when no statement has resolved it yet), so a search_path
// the handler sets cannot redirect the record. When no transaction began
// (no connection, the table's lookup or BEGIN failed) it returns a nil
// pgRouteTx, the connection given back; any later error comes with the
// pgRouteTx to end. A claim that lost reads the existing row (claimLost).
func (s *PostgresStore) begin(ctx context.Context, req *ClaimRequest, wait, lease string) (*pgRouteTx, ClaimResult, error) {
	c, err := s.acquire(ctx)
	if err != nil {
		return nil, ClaimResult{}, err
	}
	q, err := s.pool.resolved(ctx, c)
	if err != nil {
		release(c)
		return nil, ClaimResult{}, err
	}
	// The session's lock_timeout, as last read on this connection, goes
	// back after the claim; checked against what this batch reads.
	restored, _ := c.Conn().PgConn().CustomData()[lockTimeoutKey].(string)
	steps := []pgStep{{sql: pgsql.TxSessionSQL}}
	if req != nil {
		steps[0] = pgStep{sql: pgsql.TxBoundsSQL, args: []any{lease}}
		steps = append(steps, claimSteps(*req, wait, restored)...)
	}
	p := sendPipe(ctx, c.Conn(), q, true, steps...)
	t := &pgRouteTx{s: s, c: c, tx: pgQualifiedTx{p.Tx(), q}, q: q}
	if _, err = p.Exec(); err != nil {
		_ = p.Close()
		t.end(ctx)
		return nil, ClaimResult{}, err
	}
	var res ClaimResult
	if req == nil {
		err = t.session.scan(p.QueryRow())
	} else if err = t.session.scan(p.QueryRow(), &t.bounds[0], &t.bounds[1]); err == nil {
		res, err = readClaim(p, *req)
	}
	err = closeBatch(p, err)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return t, res, err
	}
	c.Conn().PgConn().CustomData()[lockTimeoutKey] = t.session.lock
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res, err = t.claimLost(ctx, *req, wait)
	case req != nil && restored != t.session.lock:
		// Put back what this connection's session really has.
		_, err = t.tx.Exec(ctx, pgSetLocal("lock_timeout", t.session.lock))
	}
	return t, res, err
}

// closeBatch closes br and returns err, the batch's first error read, or
// the error closing it reports when err is nil or only pgx.ErrNoRows (a
// claim that lost, a takeover that matched nothing: the batch's later
// statements may still have failed).
func closeBatch(br interface{ Close() error }, err error) error {
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		return cerr
	}
	return err
}

// cmpWait is a lock wait, DefaultTxLockWait for 0.
func cmpWait(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultTxLockWait
	}
	return d
}

// pgInterval is d as a setting's text value in milliseconds, rounded up
// (at least 1: 0 would mean no bound at all).
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(pgMillis(d), 1), 10) + "ms"
}

// TxLockWaitBudget implements TxStore: each try's wait in ms, rounded up, times the tries.
func (s *PostgresStore) TxLockWaitBudget(wait time.Duration) time.Duration {
	return time.Duration(pgMillis(wait)) * time.Millisecond * pgRetries
}

// pgMillis is d in whole milliseconds, rounded up: the bound PostgreSQL
// applies for d.
func pgMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// claimSteps are a transactional claim's statements: the lock wait, the
// INSERT, the savepoint, and the session's lock_timeout (restored, "" for
// the default) back.
func claimSteps(req ClaimRequest, wait, restored string) []pgStep {
	return []pgStep{
		{sql: pgSetLocal("lock_timeout", wait), alone: true},
		{sql: pgsql.TxClaimSQL, args: claimArgs(req)},
		{sql: pgsql.SavepointSQL},
		{sql: pgSetLocal("lock_timeout", restored), alone: true},
	}
}

// rowLockWait is a claim's lock wait that ran out on a row of the key:
// another open transaction owns the key (its owner is mid-handler).
type rowLockWait struct{ error }

func (e rowLockWait) Unwrap() error { return e.error }

// isRowLockWait reports a lock wait of the claim's INSERT that ran out on
// a transaction holding a row of the key (its committed or uncommitted
// insertion): PostgreSQL reports such a wait with an error context naming
// the tuple, in whatever language lc_messages says, and every other wait
// (another claim's speculative insertion, the table's extension, a lock
// on the table, its indexes or its sequence: DDL, a migration) with none.
// Only whether there is a context counts, never its text. (A statement of
// its own taking the table's lock first, LOCK TABLE under the same bound,
// would tell DDL on the table apart too, but adds nothing to this: it cost
// about 5% of the store's part of a claim and commit here, and Citus may
// pass it to every worker.)
func isRowLockWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" && pgErr.Where != ""
}

// readClaim reads the results of claimSteps into a ClaimResult; it
// returns pgx.ErrNoRows when the claim lost (the key has a row), and a
// rowLockWait when the claim's wait ran out on the key's row.
func readClaim(p *pgPipe, req ClaimRequest) (ClaimResult, error) {
	var (
		rec Record
		won bool
	)
	_, err := p.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = p.Query(); err == nil {
			err = scanClaimRows(rows, req, &rec, &won)
		}
		if isRowLockWait(err) {
			return ClaimResult{}, rowLockWait{err}
		}
	}
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		lost := err != nil
		if _, err = p.Exec(); err == nil {
			_, err = p.Exec()
		}
		if err == nil && lost {
			err = pgx.ErrNoRows
		}
	}
	if err != nil {
		return ClaimResult{}, err
	}
	return ClaimResult{Won: won, Record: rec}, nil
}

// claimLost reads the existing row of a claim that lost (pgsql.TxReadSQL; a
// plain read never waits on a lock). When that read finds no row (cleanup
// or a release removed it meanwhile) it claims again in the same
// transaction; it returns pgx.ErrNoRows when that kept happening.
func (t *pgRouteTx) claimLost(ctx context.Context, req ClaimRequest, wait string) (ClaimResult, error) {
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		rows, err := t.tx.Query(ctx, pgsql.TxReadSQL, req.Key, req.Scope, req.Endpoint)
		if err == nil {
			err = scanClaimRows(rows, req, &rec, &won)
		}
		switch {
		case err == nil:
			return ClaimResult{Won: false, Record: rec}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return ClaimResult{}, err
		}
		p := t.pipe(ctx, claimSteps(req, wait, t.session.lock)...)
		res, err := readClaim(p, req)
		if err = closeBatch(p, err); !errors.Is(err, pgx.ErrNoRows) {
			return res, err
		}
	}
	return ClaimResult{}, pgx.ErrNoRows
}

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
