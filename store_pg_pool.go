package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The pool: acquiring a connection, the outage probe, and the table's
// resolved, schema-qualified name in every statement a connection sends.

// newPostgresStore is NewPostgresStore logging to log.
func newPostgresStore(pool *pgxpool.Pool, log *slog.Logger) *PostgresStore {
	if pool.Config().ConnConfig.ConnectTimeout <= 0 {
		log.WarnContext(context.Background(), "idempotency: the PostgreSQL pool has no ConnectTimeout: a connect into a black-holed network "+
			"hangs for two minutes and wedges the pool after the network heals; set connect_timeout (a few seconds) in the URL")
	}
	s := &PostgresStore{pool: &pgPool{Pool: pool}, log: log}
	s.listen = &listener{dial: s.dialListener, notify: s.notifyPool, log: log, check: listenCheckTimeout}
	s.SetBatching(defaultBatchMax, defaultBatchConcurrency)
	return s
}

// dialListener connects the wait listener (wait_listen.go) outside the
// pool, as the pool connects (BeforeConnect included) or to ListenURL, and
// runs LISTEN.
func (s *PostgresStore) dialListener(ctx context.Context) (listenConn, error) {
	cfg := s.listenCfg.Load()
	if cfg == nil {
		pc := s.pool.Config() // a copy
		if pc.BeforeConnect != nil {
			if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
				return nil, err
			}
		}
		cfg = pc.ConnConfig
	}
	c, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, pgsql.ListenSQL); err != nil {
		pgListenConn{c}.close()
		return nil, err
	}
	return pgListenConn{c}, nil
}

// notifyPool sends a notification through the pool (the listener's test).
func (s *PostgresStore) notifyPool(ctx context.Context, payload string) error {
	return s.withConn(ctx, func(c pgConn) error {
		_, err := c.Exec(ctx, pgsql.NotifySQL, payload)
		return err
	})
}

// wake wakes the waiters of f's row after its record committed on c
// (Fence.wake): pgsql.WakeSQL, in one round trip. A failure is logged and
// never fails the record; a connection it leaves inside the transaction
// leaves the pool on release.
func (s *PostgresStore) wake(ctx context.Context, c pgConn, f Fence) {
	if !f.wake {
		return
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(pgsql.WakeSQL, f.ID)); err != nil {
		s.log.WarnContext(ctx, "idempotency: the wake-up of the duplicates waiting on a record failed; they poll", "row", f.ID, "error", err)
	}
}

// pgListenConn is the wait listener's connection.
type pgListenConn struct{ c *pgx.Conn }

func (l pgListenConn) next(ctx context.Context) (string, error) {
	n, err := l.c.WaitForNotification(ctx)
	if err != nil {
		return "", err
	}
	return n.Payload, nil
}

func (l pgListenConn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.c.Close(ctx)
}

// acquire takes a connection from the pool under ctx. The store acquires
// explicitly, then runs its statement on the connection, so it knows which
// step ran out of time: a wait for a connection that ran out is an
// *acquireError (pool_exhausted), logged with the pool's state.
func (s *PostgresStore) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	c, err := s.pool.Acquire(ctx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return nil, err // refused, closed: the error says which
	}
	st := s.pool.Stat()
	inUse, opening, max := st.AcquiredConns(), st.ConstructingConns(), st.MaxConns()
	return nil, &acquireError{err: err, inUse: inUse, opening: opening, max: max}
}

// release gives c back to the pool. A connection pgx closed because a
// deadline interrupted its statement is still being torn down in the
// background (a cancel request, then a drain of up to 15 seconds, all of
// which a black-holed network takes), and the pool would count it in use
// until then, so that the next calls would read as saturation: it leaves
// the pool at once instead, and pgx closes its socket.
func release(c *pgxpool.Conn) {
	if c.Conn().IsClosed() {
		_ = c.Hijack()
		return
	}
	c.Release()
}

// withConn runs f on a connection acquired under ctx (conn), then
// releases it.
func (s *PostgresStore) withConn(ctx context.Context, f func(pgConn) error) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.release()
	return f(c)
}

// Probe implements Store with the pool's connection settings.
func (s *PostgresStore) Probe(ctx context.Context) error {
	return s.probes.Do(ctx, func(ctx context.Context) error {
		return postgresClasses.probeVerdict(s.probe(ctx))
	})
}

// probe connects as the pool does (BeforeConnect included) and runs
// SELECT 1. Through PgBouncer the statement reaches the database, and
// PgBouncer's own error for a server it cannot reach (class 08) is a
// failed probe.
func (s *PostgresStore) probe(ctx context.Context) error {
	cfg := s.pool.Config() // a copy
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return err
		}
	}
	c, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, pgsql.ProbeSQL)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second) // the Terminate, not the verdict
	defer cancel()
	_ = c.Close(cctx)
	return err
}

// How PostgresStore names its table. Every statement is written once,
// naming idempotency_keys; the store sends it with the table
// schema-qualified, in the schema where the pool's search_path found the
// table when the store resolved it. A connection whose search_path changed
// later (a handler's plain SET search_path outlives its transaction on the
// pooled connection) can then never send a claim to another schema's table
// of that name, a second copy of every key.

// pgTable is the table's name as the statements are written.
const pgTable = pgsql.Table

// qualify returns sql naming table wherever it names pgTable.
func qualify(sql, table string) string { return pgsql.Qualify(sql, table) }

// pgStatements is every SQL statement the Postgres store sends, by the
// name of its constant, but for Check's privilege probe (pgProbe): the
// ones sent with the table qualified, and the ones the Citus rules check
// (store_pg_pool_statements_test.go). TestPostgresStatementsListed keeps it complete.
var pgStatements = map[string]string{
	"pgsql.ClaimSQL":               pgsql.ClaimSQL,
	"pgsql.TakeoverSQL":            pgsql.TakeoverSQL,
	"pgsql.CompleteSQL":            pgsql.CompleteSQL,
	"pgsql.FailSQL":                pgsql.FailSQL,
	"pgsql.ReleaseSQL":             pgsql.ReleaseSQL,
	"pgsql.ReleaseOwnerSQL":        pgsql.ReleaseOwnerSQL,
	"pgsql.RenewSQL":               pgsql.RenewSQL,
	"pgsql.ExpiredBatchSQL":        pgsql.ExpiredBatchSQL,
	"pgsql.DeleteExpiredSQL":       pgsql.DeleteExpiredSQL,
	"pgsql.PurgeBatchSQL":          pgsql.PurgeBatchSQL,
	"pgsql.PurgeScopeSQL":          pgsql.PurgeScopeSQL,
	"pgsql.DeleteScopeSQL":         pgsql.DeleteScopeSQL,
	"pgsql.ExportScopeSQL":         pgsql.ExportScopeSQL,
	"pgsql.TxSessionSQL":           pgsql.TxSessionSQL,
	"pgsql.TxBoundsSQL":            pgsql.TxBoundsSQL,
	"pgsql.TxTakeoverSQL":          pgsql.TxTakeoverSQL,
	"pgsql.TxRestoreSQL":           pgsql.TxRestoreSQL,
	"pgsql.SessionRestoreSQL":      pgsql.SessionRestoreSQL,
	"pgsql.SavepointSQL":           pgsql.SavepointSQL,
	"pgsql.RollbackToSavepointSQL": pgsql.RollbackToSavepointSQL,
	"pgsql.ImmediateSQL":           pgsql.ImmediateSQL,
	"pgsql.TxCompleteSQL":          pgsql.TxCompleteSQL,
	"pgsql.TxFailSQL":              pgsql.TxFailSQL,
	"pgsql.EndLeaseSQL":            pgsql.EndLeaseSQL,
	"pgsql.ReconcileClaimSQL":      pgsql.ReconcileClaimSQL,
	"pgsql.StaleSQL":               pgsql.StaleSQL,
	"pgsql.CommitSQL":              pgsql.CommitSQL,
	"pgsql.CheckSQL":               pgsql.CheckSQL,
	"pgsql.TableSQL":               pgsql.TableSQL,
	"pgsql.TxClaimSQL":             pgsql.TxClaimSQL,
	"pgsql.TxReadSQL":              pgsql.TxReadSQL,
	"pgsql.NowSQL":                 pgsql.NowSQL,
	"pgsql.ProbeSQL":               pgsql.ProbeSQL,
	"pgsql.ListenSQL":              pgsql.ListenSQL,
	"pgsql.WakeSQL":                pgsql.WakeSQL,
	"pgsql.NotifySQL":              pgsql.NotifySQL,
	"pgsql.ClaimBatchSQL":          pgsql.ClaimBatchSQL,
	"pgsql.CompleteBatchSQL":       pgsql.CompleteBatchSQL,
	"pgsql.CitusSQL":               pgsql.CitusSQL,
	"pgsql.CitusTableSQL":          pgsql.CitusTableSQL,
	"pgsql.RoundSettingsSQL":       pgsql.RoundSettingsSQL,
}

// pgQualified is pgStatements with the table's name qualified.
type pgQualified struct {
	table string            // the qualified name, such as app.idempotency_keys
	sql   map[string]string // a statement as written -> as sent
}

func newPgQualified(table string) *pgQualified {
	q := &pgQualified{table: table, sql: make(map[string]string, len(pgStatements)+len(pgProbe))}
	for _, s := range pgStatements {
		q.sql[s] = qualify(s, table)
	}
	for _, p := range pgProbe {
		q.sql[p.sql] = qualify(p.sql, table)
	}
	return q
}

// of returns sql as sent: qualified when it is one of pgStatements (and q
// is not nil), else unchanged.
func (q *pgQualified) of(sql string) string {
	if q != nil {
		if s, ok := q.sql[sql]; ok {
			return s
		}
	}
	return sql
}

// batch qualifies b's statements in place.
func (q *pgQualified) batch(b *pgx.Batch) {
	for _, qq := range b.QueuedQueries {
		qq.SQL = q.of(qq.SQL)
	}
}

// pgPool is the store's pool: pgxpool's, whose Query, QueryRow, Exec,
// SendBatch and BeginTx (and the transaction BeginTx returns) send each of
// pgStatements with the table qualified, as do the connections the store
// acquires (PostgresStore.conn). Other SQL passes unchanged, and what is
// sent on a connection of pgxpool's own (Acquire) is sent as it is.
//
// The table is resolved once per store: by Check (the schema it checked),
// or, when Check was never called, by the store's first statement, one
// statement more on its connection, under that call's deadline. Until a
// table is found the statements go unqualified, and the server answers
// for the missing table.
type pgPool struct {
	*pgxpool.Pool
	qualified atomic.Pointer[pgQualified]
}

// rowQuerier runs a statement returning one row.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// resolved returns the qualified statements, resolving the table on db
// first when no statement has yet: nil (statements sent as written) while
// there is no table.
func (p *pgPool) resolved(ctx context.Context, db rowQuerier) (*pgQualified, error) {
	if q := p.qualified.Load(); q != nil {
		return q, nil
	}
	var table string
	err := db.QueryRow(ctx, pgsql.TableSQL, pgTable).Scan(&table)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return p.resolve(table), nil
}

// resolve records table as the store's table unless one is recorded
// already, and returns the statements for the one recorded.
func (p *pgPool) resolve(table string) *pgQualified {
	p.qualified.CompareAndSwap(nil, newPgQualified(table))
	return p.qualified.Load()
}

// table is the name Check looks up: the resolved table, else the name as
// the search_path finds it.
func (p *pgPool) table() string {
	if q := p.qualified.Load(); q != nil {
		return q.table
	}
	return pgTable
}

func (p *pgPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	q, err := p.resolved(ctx, p.Pool)
	if err != nil {
		return nil, err
	}
	return p.Pool.Query(ctx, q.of(sql), args...)
}

func (p *pgPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	q, err := p.resolved(ctx, p.Pool)
	if err != nil {
		return errRow{err}
	}
	return p.Pool.QueryRow(ctx, q.of(sql), args...)
}

func (p *pgPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q, err := p.resolved(ctx, p.Pool)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.Pool.Exec(ctx, q.of(sql), args...)
}

func (p *pgPool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	q, err := p.resolved(ctx, p.Pool)
	if err != nil {
		return errBatch{err}
	}
	q.batch(b)
	return p.Pool.SendBatch(ctx, b)
}

func (p *pgPool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	q, err := p.resolved(ctx, p.Pool)
	if err != nil {
		return nil, err
	}
	tx, err := p.Pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return pgQualifiedTx{tx, q}, nil
}

// The connections and transactions of PostgresStore that qualify the table
// in what they send (store_pg_pool.go).

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
