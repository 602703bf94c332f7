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
)

// The PostgreSQL dialect: the pgx store's table and statements, through a
// database/sql driver (pgx's stdlib, lib/pq), so the two stores can share
// one table and replay each other's rows. Every statement names the table
// qualified by the schema New resolved, so a handler's SET search_path
// cannot send a claim to another table.

// pgStored are a row's stored columns (the pgx store's order).
const pgStored = `id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at`

// pgFlags are the flags against the database's clock.
const pgFlags = `expires_at < now() AS expired, locked_until < now() AS lease_over`

// pgStatements are the PostgreSQL dialect's statements for one table.
func pgStatements(table string) statements {
	r := strings.NewReplacer("T_", table, "STORED_", pgStored, "FLAGS_", pgFlags)
	q := func(s string) string { return r.Replace(s) }
	return statements{
		// The pgx store's claim: the INSERT, or the existing row in the
		// same statement; no row when the conflicting row committed after
		// the statement's snapshot (run it again).
		// $1 key, $2 scope, $3 endpoint, $4 hash, $5 lease, $6 TTL, $7 owner.
		insert: q(`WITH ins AS (
	INSERT INTO T_ (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		created_at, locked_at, locked_until, expires_at, owner_token)
	VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1, now(), now(), now() + $5::interval, now() + $6::interval, $7::uuid)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING STORED_
)
SELECT STORED_, false, false, true AS won FROM ins
UNION ALL
SELECT STORED_, FLAGS_,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $7::uuid) IS TRUE AS won
FROM T_ WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3 AND NOT EXISTS (SELECT 1 FROM ins)`),
		// $1 owner, $2 key, $3 scope, $4 endpoint.
		readKey: q(`SELECT STORED_, FLAGS_,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $1::uuid) IS TRUE AS won
FROM T_ WHERE idem_key = $2 AND scope_user_id = $3 AND scope_endpoint = $4`),
		// readID is MySQL's: PostgreSQL's claim and takeover return their row.
		// $1 hash, $2 lease, $3 TTL, $4 owner, $5 id, $6 scope, $7 attempt, $8 key, $9 endpoint.
		takeover: q(`UPDATE T_ SET attempt = attempt + 1, request_hash = decode($1, 'hex'), status = 'in_flight',
	response_code = NULL, response_body = NULL, response_body_raw = NULL, response_headers = NULL, seal_key_id = NULL,
	created_at = now(), locked_at = now(), locked_until = now() + $2::interval, expires_at = now() + $3::interval,
	owner_token = $4::uuid
WHERE scope_user_id = $6 AND idem_key = $8 AND scope_endpoint = $9 AND id = $5 AND attempt = $7 AND expires_at < now()
	AND NOT (status = 'in_flight' AND locked_until >= now())
RETURNING STORED_, false, false, true`),
		// The fenced statements find the row by its primary key (scope,
		// key, endpoint) and check its id and attempt.
		// $1 code, $2 JSON body, $3 raw body, $4 headers (JSON), $5 seal key id, $6 id, $7 scope, $8 attempt, $9 key, $10 endpoint.
		complete: q(`UPDATE T_ SET status = 'completed',
	response_code = $1, response_body = $2, response_body_raw = $3, response_headers = $4, seal_key_id = $5
WHERE scope_user_id = $7 AND idem_key = $9 AND scope_endpoint = $10 AND id = $6 AND status = 'in_flight' AND attempt = $8`),
		// $1 id, $2 scope, $3 attempt, $4 key, $5 endpoint.
		fail: q(`UPDATE T_ SET status = 'failed'
WHERE scope_user_id = $2 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1 AND status = 'in_flight' AND attempt = $3`),
		// endLease ends an in_flight row's lease now; fail's arguments.
		endLease: q(`UPDATE T_ SET locked_until = now()
WHERE scope_user_id = $2 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1 AND status = 'in_flight' AND attempt = $3`),
		release: q(`DELETE FROM T_
WHERE scope_user_id = $2 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1 AND status = 'in_flight' AND attempt = $3`),
		// $1 key, $2 scope, $3 endpoint, $4 owner.
		releaseOwner: q(`DELETE FROM T_ WHERE scope_user_id = $2 AND idem_key = $1 AND scope_endpoint = $3
	AND status = 'in_flight' AND owner_token = $4::uuid`),
		// $1 limit.
		cleanup: q(`WITH batch AS (
	SELECT scope_user_id, idem_key, scope_endpoint FROM T_
	WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
	ORDER BY expires_at LIMIT $1
)
DELETE FROM T_ t USING batch b
WHERE t.scope_user_id = b.scope_user_id AND t.idem_key = b.idem_key AND t.scope_endpoint = b.scope_endpoint
	AND t.expires_at < now() AND NOT (t.status = 'in_flight' AND t.locked_until >= now())`),
		now:         `SELECT now()`,
		eraseDelete: q(`DELETE FROM T_ WHERE scope_user_id = $1 AND NOT (status = 'in_flight' AND locked_until >= $2)`),
		eraseKept: q(`SELECT STORED_, FLAGS_, false FROM T_ WHERE scope_user_id = $1 AND status = 'in_flight' AND locked_until >= $2
ORDER BY created_at, id`),
		export:            q(`SELECT STORED_, FLAGS_, false FROM T_ WHERE scope_user_id = $1 ORDER BY created_at, id`),
		savepoint:         `SAVEPOINT idempotency_claim`,
		rollbackSavepoint: `ROLLBACK TO SAVEPOINT idempotency_claim`,
	}
}

// pgTxInsert is a transactional claim's INSERT alone (a loser reads the
// row with readKey, a second statement), as the pgx store's.
const pgTxInsert = `INSERT INTO T_ (idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	created_at, locked_at, locked_until, expires_at, owner_token)
VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1, now(), now(), now() + $5::interval, now() + $6::interval, $7::uuid)
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
RETURNING ` + pgStored + `, false, false, true`

// pgBoundSQL bounds a transactional claim, for its transaction only: the
// lock wait ($2), and statement_timeout and
// idle_in_transaction_session_timeout to the lease ($1) unless the
// session's own bound is smaller (0, no bound, counting as the largest).
// It returns the session's lock_timeout, put back after the claim, and
// its synchronous_commit, put back for the record.
const pgBoundSQL = `SELECT s.lt,
	set_config('lock_timeout', $2, true),
	set_config('statement_timeout', CASE WHEN s.st::interval > '0' AND s.st::interval <= $1::text::interval THEN s.st ELSE $1::text END, true),
	set_config('idle_in_transaction_session_timeout', CASE WHEN s.it::interval > '0' AND s.it::interval <= $1::text::interval THEN s.it ELSE $1::text END, true),
	s.sc
FROM (SELECT current_setting('lock_timeout') AS lt, current_setting('statement_timeout') AS st,
	current_setting('idle_in_transaction_session_timeout') AS it, current_setting('synchronous_commit') AS sc OFFSET 0) AS s`

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
	err := scanRecord(x.QueryRowContext(ctx, s.st.insert, s.insertArgs(req)...), &rec, &won)
	if errors.Is(err, sql.ErrNoRows) {
		return idempotency.ClaimResult{}, errRetryClaim
	}
	return idempotency.ClaimResult{Won: won, Record: rec}, err
}

// errRetryClaim is a claim statement that read no row: run it again.
var errRetryClaim = errors.New("sqlstore: the claim read no row")

func (s *Store) pgCleanupOn(ctx context.Context, c *sql.Conn, limit int) (int64, error) {
	r, err := c.ExecContext(ctx, s.st.cleanup, limit)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// pgClaim is the transactional claim: the bounds and the lock wait (one
// statement), the INSERT, the session's lock_timeout back; a loser reads
// the existing row in a fresh statement (at READ COMMITTED it sees the row
// whose owner committed while the claim waited).
func (t *routeTx) pgClaim(ctx context.Context, req idempotency.ClaimRequest, wait time.Duration) (idempotency.ClaimResult, error) {
	if err := t.c.QueryRowContext(ctx, pgBoundSQL, pgInterval(req.Lease), pgInterval(wait)).
		Scan(&t.savedLock, new(string), &t.bounds[0], &t.bounds[1], &t.bounds[2]); err != nil {
		return idempotency.ClaimResult{}, err
	}
	insert := strings.ReplaceAll(pgTxInsert, "T_", t.s.table)
	for range retries {
		if err := t.mayWait(); err != nil {
			return idempotency.ClaimResult{}, err
		}
		var rec idempotency.Record
		err := scanRecord(t.c.QueryRowContext(ctx, insert, t.s.insertArgs(req)...), &rec, nil)
		if err == nil {
			return idempotency.ClaimResult{Won: true, Record: rec}, t.pgLockWaitRestore(ctx)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return idempotency.ClaimResult{}, err
		}
		var won bool
		err = scanRecord(t.c.QueryRowContext(ctx, t.s.st.readKey, nil, req.Key, req.Scope, req.Endpoint), &rec, &won)
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
