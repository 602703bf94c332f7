package idempotency

// The statements of a transactional route's claim (DESIGN.md
// "Transactional routes: one transaction"). They run pipelined in one
// batch with BEGIN (store_pg_tx.go): the session's state read
// (pgTxSessionSQL), the server-side bounds of a vanished owner
// (pgTxBoundsSQL), the lock wait (a literal SET LOCAL, built by
// pgSetLocal), the claim, the savepoint the failure paths roll back to,
// and the session's lock_timeout back. No RETURNING list calls a function
// that is not IMMUTABLE or reads a setting: Citus refuses the first, and
// evaluates RETURNING on a worker, which cannot see a coordinator's
// setting. The lock wait is SET LOCAL, never set_config, which never
// reaches Citus's workers.

// pgTxSessionSQL reads the session's state a transactional route depends
// on: at BEGIN (what the record and COMMIT run with, and what the
// connection goes back to the pool with), and again after COMMIT.
const pgTxSessionSQL = `SELECT current_setting('role'), current_setting('search_path'),
	current_setting('synchronous_commit'), current_setting('statement_timeout'),
	current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'),
	current_user::text`

// pgTxBoundsSQL is pgTxSessionSQL for a claim, followed by the bounds
// it sets, for this transaction only, on statement_timeout and
// idle_in_transaction_session_timeout, so that a vanished owner's session
// ends: the smaller of the lease and the session's own bound wins, 0 (no
// bound) counting as the largest. It returns both bounds as set. They
// matter on the coordinator only, so set_config may set them (a parameter
// cannot follow SET LOCAL). The session's state is read first (OFFSET 0
// keeps its subquery a plan node of its own).
//
// $1 lease (text, such as "10000ms").
const pgTxBoundsSQL = `SELECT session.*,
	set_config('statement_timeout', CASE WHEN st::interval > '0' AND st::interval <= $1::text::interval THEN st ELSE $1::text END, true),
	set_config('idle_in_transaction_session_timeout', CASE WHEN it::interval > '0' AND it::interval <= $1::text::interval THEN it ELSE $1::text END, true)
FROM (SELECT current_setting('role'), current_setting('search_path'), current_setting('synchronous_commit'),
	current_setting('statement_timeout') AS st, current_setting('lock_timeout'),
	current_setting('idle_in_transaction_session_timeout') AS it, current_user::text OFFSET 0) AS session`

// pgTxColumns are the columns a transactional claim returns for the row
// it now owns: fresh, so neither expired nor past its lease (constants,
// not now(): RETURNING).
const pgTxColumns = `request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at,
	false AS expired, false AS lease_over`

// pgTxClaimSQL is a transactional route's claim: the INSERT alone, without
// pgClaimSQL's read of an existing row. Inside the route's transaction the
// winner is the common case (a miss runs the handler), and this statement
// costs it less than the CTE (measured with pgbench, 16 clients, the
// example's order transaction: 5,600 tps against 5,140-5,370); a loser
// reads the row with pgTxReadSQL, a second statement. No owner-token win:
// a transactional claim is never retried after a lost connection (its
// transaction rolled back with it). A claim that inserted nothing returns
// nothing.
//
// $1 key, $2 scope, $3 endpoint, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token (NULL for none).
const pgTxClaimSQL = `INSERT INTO idempotency_keys
	(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	 created_at, locked_at, locked_until, expires_at, owner_token)
VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1,
	now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid)
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
RETURNING id, ` + pgTxColumns + `, true AS won`

// pgTxReadSQL reads the key's existing row for a transactional claim that
// lost. At READ COMMITTED it takes a new snapshot, so it sees a row whose
// owner committed while the claim waited.
//
// $1 key, $2 scope, $3 endpoint.
const pgTxReadSQL = `SELECT ` + pgClaimColumns + `, false AS won FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3`

// pgTxTakeoverSQL is pgTakeoverSQL inside a transactional route's
// transaction, with the same UPDATE (pgTakenCTE): the row it returns is
// fresh, so its flags are constants, as in pgTxColumns.
const pgTxTakeoverSQL = pgTakenCTE + `
SELECT ` + pgStoredColumns + `, false AS expired, false AS lease_over FROM taken`

// pgTxRestoreSQL puts back, for the rest of the transaction, the claim's
// statement_timeout (first: the statements after it run under it), the
// search_path and the claim's idle bound the record and COMMIT run with,
// whatever the handler set (set_config parses a search_path list as SET
// would); the role, synchronous_commit and lock_timeout go back with SET
// LOCAL (pgSetLocal).
//
// $1 statement_timeout, $2 search_path, $3 idle_in_transaction_session_timeout.
const pgTxRestoreSQL = `SELECT set_config('statement_timeout', $1, true), set_config('search_path', $2, true),
	set_config('idle_in_transaction_session_timeout', $3, true)`

// pgSessionRestoreSQL is pgTxRestoreSQL for the session, after COMMIT: a
// handler's SET without LOCAL outlives its transaction.
const pgSessionRestoreSQL = `SELECT set_config('search_path', $1, false), set_config('statement_timeout', $2, false),
	set_config('idle_in_transaction_session_timeout', $3, false)`

// pgSavepointSQL marks the point the failure paths roll back to: the key
// is owned, the handler has not written yet.
const pgSavepointSQL = `SAVEPOINT idempotency_claim`

// pgRollbackToSavepointSQL undoes the handler's writes and keeps the claim.
const pgRollbackToSavepointSQL = `ROLLBACK TO SAVEPOINT idempotency_claim`

// pgTxCompleteSQL is pgCompleteSQL for a transactional route, pipelined
// with COMMIT: when no row matches (the handler changed or deleted the
// key's row), the guard divides by zero, so the batch stops before its
// COMMIT instead of committing the handler's writes without a record.
const pgTxCompleteSQL = `WITH rec AS (` + pgCompleteSQL + `
RETURNING 1)
SELECT 1 / count(*)::int FROM rec`

// pgTxFailSQL is pgFailSQL with pgTxCompleteSQL's guard.
const pgTxFailSQL = `WITH rec AS (` + pgFailSQL + `
RETURNING 1)
SELECT 1 / count(*)::int FROM rec`

// pgCommitSQL commits a transactional route's transaction.
const pgCommitSQL = `COMMIT`

// pgImmediateSQL checks every deferred constraint now, before the record:
// a violation then fails where a failed record can still be written,
// instead of at COMMIT, where the claim would vanish with it.
const pgImmediateSQL = `SET CONSTRAINTS ALL IMMEDIATE`

// pgEndLeaseSQL ends the lease of a claim a handler committed with its own
// COMMIT (RouteTx.EndLease), fenced on the owner's attempt, and changes
// nothing else: the retry answers idempotency_outcome_unknown.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const pgEndLeaseSQL = `UPDATE idempotency_keys SET locked_until = now()
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`
