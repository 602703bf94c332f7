package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/pgsql"
)

// The PostgreSQL dialect: the pgx store's table and statements, through a
// database/sql driver (pgx's stdlib, lib/pq), so the two stores can share
// one table and replay each other's rows. Every statement names the table
// qualified by the schema New resolved, so a handler's SET search_path
// cannot send a claim to another table.

// pgStatements are the PostgreSQL dialect's statements for one table:
// the pgx store's (internal/pgsql), qualified by the table. Their
// arguments and columns are pgsql's: pgClaimArgs, fenceArgs, scanClaim,
// scanColumns.
func pgStatements(table string) statements {
	q := func(sql string) string { return pgsql.Qualify(sql, table) }
	return statements{
		insert:            q(pgsql.ClaimSQL),
		readKey:           q(pgsql.TxReadSQL),
		takeover:          q(pgsql.TakeoverSQL),
		complete:          q(pgsql.CompleteSQL),
		fail:              q(pgsql.FailSQL),
		endLease:          q(pgsql.EndLeaseSQL),
		reconcileClaim:    q(pgsql.ReconcileClaimSQL),
		stale:             q(pgsql.StaleSQL),
		renew:             q(pgsql.RenewSQL),
		release:           q(pgsql.ReleaseSQL),
		releaseOwner:      q(pgsql.ReleaseOwnerSQL),
		cleanup:           q(pgsql.CleanupSQL),
		purge:             q(pgsql.PurgeSQL),
		now:               pgsql.NowSQL,
		eraseDelete:       q(pgsql.EraseDeleteSQL),
		eraseKept:         q(pgsql.EraseKeptSQL),
		export:            q(pgsql.ExportScopeSQL),
		savepoint:         pgsql.SavepointSQL,
		rollbackSavepoint: pgsql.RollbackToSavepointSQL,
		txInsert:          q(pgsql.TxClaimSQL),
		cleanupPlans:      pgsql.CustomPlanSQL,
	}
}

// pgClaimArgs are pgsql.ClaimSQL's and pgsql.TxClaimSQL's arguments for req.
func (s *Store) pgClaimArgs(req idempotency.ClaimRequest) []any {
	return []any{req.Key, req.Scope, req.Endpoint, s.hashArg(req.RequestHash), pgInterval(req.TTL), pgInterval(req.Lease), s.ownerArg(req), req.DeriveKeyID, pgGrace(req.Grace)}
}

// pgGrace is a grace as an interval's text in milliseconds, rounded up: 0
// is none (pgInterval's least is 1 ms).
func pgGrace(d time.Duration) string {
	if d <= 0 {
		return "0ms"
	}
	return pgInterval(d)
}

// newPostgres finishes New for the PostgreSQL dialect: the schema is
// cfg.Schema, or the connection's current_schema().
func newPostgres(ctx context.Context, s *Store, db *sql.DB, cfg Config, table string) (*Store, error) {
	s.d = pgDialect
	schema := cfg.Schema
	if schema == "" {
		var cur sql.NullString
		if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&cur); err != nil {
			return nil, fmt.Errorf("sqlstore: New: %w", s.storeError("check", err))
		}
		if !cur.Valid {
			return nil, errors.New("sqlstore: New: the connection's search_path names no existing schema: name one in Config.Schema")
		}
		schema = cur.String
	}
	s.table = pgQuote(schema) + "." + pgQuote(table)
	s.st = pgStatements(s.table)
	return s, nil
}

// pgQuote quotes an identifier.
func pgQuote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// pgInterval is d as an interval's text in milliseconds, rounded up, at
// least 1.
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Millisecond-1)/time.Millisecond), 1), 10) + "ms"
}

// pgInsertOn runs the claim's statement: the new row, or the existing one;
// no row (the conflicting row committed after the statement's snapshot, or
// was deleted) is reported as a duplicate with no row found, which runs the
// claim again.
func (s *Store) pgInsertOn(ctx context.Context, x execer, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var rec idempotency.Record
	var won bool
	err := scanClaim(x.QueryRowContext(ctx, s.st.insert, s.pgClaimArgs(req)...), req, &rec, &won)
	if errors.Is(err, sql.ErrNoRows) {
		return idempotency.ClaimResult{}, errRetryClaim
	}
	return idempotency.ClaimResult{Won: won, Record: rec}, err
}

// errRetryClaim is a claim statement that read no row: run it again.
var errRetryClaim = errors.New("sqlstore: the claim read no row")

// pgClaim is the transactional claim: the bounds (pgsql.TxBoundsSQL), the
// lock wait, the INSERT, the session's lock_timeout back; a loser reads
// the existing row in a fresh statement (at READ COMMITTED it sees the row
// whose owner committed while the claim waited).
func (t *routeTx) pgClaim(ctx context.Context, req idempotency.ClaimRequest, wait time.Duration) (idempotency.ClaimResult, error) {
	skip := new(string)
	if err := t.c.QueryRowContext(ctx, pgsql.TxBoundsSQL, pgInterval(req.Lease)).
		Scan(skip, skip, &t.bounds[2], skip, skip, skip, skip, &t.bounds[0], &t.bounds[1]); err != nil {
		return idempotency.ClaimResult{}, err
	}
	if err := t.pgLockWait(ctx, wait); err != nil {
		return idempotency.ClaimResult{}, err
	}
	for range retries {
		if err := t.mayWait(); err != nil {
			return idempotency.ClaimResult{}, err
		}
		var rec idempotency.Record
		var won bool
		err := scanClaim(t.c.QueryRowContext(ctx, t.s.st.txInsert, t.s.pgClaimArgs(req)...), req, &rec, &won)
		if err == nil {
			return idempotency.ClaimResult{Won: true, Record: rec}, t.pgLockWaitRestore(ctx)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return idempotency.ClaimResult{}, err
		}
		err = scanClaim(t.c.QueryRowContext(ctx, t.s.st.readKey, req.Key, req.Scope, req.Endpoint), req, &rec, &won)
		if err == nil {
			return idempotency.ClaimResult{Record: rec}, t.pgLockWaitRestore(ctx)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return idempotency.ClaimResult{}, err
		}
	}
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: errClaimVanished}
}

// pgRestoreSession puts back, for the record and COMMIT, what the claim
// found or set, whatever the handler set since (a SET without LOCAL too):
// statement_timeout, idle_in_transaction_session_timeout and
// synchronous_commit, and the session's own role (a handler's SET [LOCAL]
// ROLE to a role without grants on the table must not fail the record).
// search_path needs nothing: every statement names its table qualified.
func (t *routeTx) pgRestoreSession(ctx context.Context) error {
	if t.bounds[0] == "" {
		return nil
	}
	_, err := t.c.ExecContext(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true),
	set_config('synchronous_commit', $3, true), set_config('role', 'none', true)`, t.bounds[0], t.bounds[1], t.bounds[2])
	return err
}

// pgLockWait bounds the lock wait of the next statements, saving the
// transaction's lock_timeout.
func (t *routeTx) pgLockWait(ctx context.Context, wait time.Duration) error {
	return t.c.QueryRowContext(ctx, `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`, pgInterval(wait)).
		Scan(&t.savedLock, new(string))
}

// pgLockWaitRestore puts the saved lock_timeout back.
func (t *routeTx) pgLockWaitRestore(ctx context.Context) error {
	_, err := t.c.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true)`, t.savedLock)
	return err
}

// pgAfterEnd resets the session after the transaction ended (RESET ALL:
// every setting back to the connection's defaults, search_path
// included; RESET ROLE, which RESET ALL leaves), so a handler's SET
// without LOCAL never outlives its request; false when that failed, and
// the connection is closed instead. (DISCARD ALL would also drop the
// driver's prepared statements under it.)
func (t *routeTx) pgAfterEnd(ctx context.Context) bool {
	_, err := t.c.ExecContext(ctx, `RESET ALL; RESET ROLE`)
	return err == nil
}

// pgBytes is a JSON body's or the headers' text as bytea takes it: bytes,
// stored and replayed as they are (a string would be read as bytea's
// escaped text form).
func pgBytes(v any) any {
	if s, ok := v.(string); ok {
		return []byte(s)
	}
	return v
}
