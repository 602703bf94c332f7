// Package pgsql holds the PostgreSQL statements of the pgx store
// (PostgresStore in the root package), written once: the store sends them,
// sqlstore's PostgreSQL dialect sends them through database/sql, the bench
// reads them. Every statement names the table idempotency_keys; a store
// schema-qualifies it before sending (Qualify).
package pgsql

import (
	"regexp"
	"strings"
)

// Table is the table's name as the statements are written.
const Table = "idempotency_keys"

// tableName matches Table where a statement names it: as an identifier,
// or as a literal (pg_get_serial_sequence's argument).
var tableName = regexp.MustCompile(`'` + Table + `'|\b` + Table + `\b`)

// Qualify returns sql naming table wherever it names Table.
func Qualify(sql, table string) string {
	return tableName.ReplaceAllStringFunc(sql, func(m string) string {
		if m[0] == '\'' {
			return "'" + strings.ReplaceAll(table, "'", "''") + "'"
		}
		return table
	})
}

// StoredColumns are a row's columns as stored, in the order scanRecord
// reads them.
// request_hash is its 32 bytes: the store reads them as the lower-case hex
// it compares (scanRecord).
const StoredColumns = `id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at, derive_key_id`

// Flags are the three flags scanRecord reads after the stored columns,
// computed against the database's clock: expired, past its lease, and a
// tombstone (expired, kept until a later retain_until, which has not
// passed). Never in a RETURNING list:
// Citus refuses a function that is not IMMUTABLE there (now() is not), so
// a statement that writes returns the stored columns and an outer SELECT
// over its CTE computes the flags, on the coordinator.
const Flags = `expires_at < now() AS expired, locked_until < now() AS lease_over,
	(expires_at < now() AND retain_until > expires_at AND retain_until >= now()) AS tombstone`

// Columns are the columns every statement returning rows returns, in the
// order scanRecord reads them.
const Columns = StoredColumns + `,
	` + Flags

// ClaimStoredColumns are StoredColumns without the key, scope and
// endpoint, which a claim already knows: the hot path decodes three
// strings fewer.
const ClaimStoredColumns = `id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at, derive_key_id`

// ClaimColumns are ClaimStoredColumns and Flags.
const ClaimColumns = ClaimStoredColumns + `,
	` + Flags

// ClaimSQL inserts a new in_flight row or, when the key exists, reads the
// existing row, in one statement. The read shares the INSERT's snapshot, so
// when the conflicting row was committed after the statement began (or was
// deleted), it returns no row and the caller runs the statement again.
// ON CONFLICT DO NOTHING never locks or writes the existing row, so replays
// of one key never queue behind each other. The flags (Flags) are
// computed over the CTE, not in its RETURNING list, for Citus.
//
// The existing row counts as won when it is the caller's own claim: in
// flight, inside its lease and holding the caller's owner token (a claim
// whose reply was lost, run again by retryConnLoss or by the caller). A
// NULL token (none given, or a row of another writer) never matches.
//
// $1 key, $2 scope, $3 endpoint, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token (NULL for none), $8 derive key id (empty for none), $9
// grace (retain_until = expires_at + grace).
const ClaimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, owner_token, derive_key_id, retain_until)
	VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1,
		now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid, $8, now() + $5::interval + $9::interval)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING ` + ClaimStoredColumns + `, retain_until
)
SELECT ` + ClaimColumns + `, true AS won FROM ins
UNION ALL
SELECT ` + ClaimColumns + `,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $7::uuid) IS TRUE AS won
FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3
	AND NOT EXISTS (SELECT 1 FROM ins)`

// TakeoverSQL turns an expired row into a fresh claim, fenced on attempt:
// a row past its retain_until, which for a tombstone is after its grace.
// An in_flight row whose lease still runs is left to its owner even when
// expired (instances with different TTL and lease settings can produce one).
// The new owner's token replaces the old one (NULL when it gave none). The
// row's derive key id stays (a re-execution sends the same derived keys),
// set only where the first claim stored none. The
// flags are computed over the CTE, as in ClaimSQL.
//
// Every fenced statement finds its row by the primary key (scope_user_id,
// idem_key, scope_endpoint), and checks the id (a key released and claimed
// again is another row) and the attempt; on Citus the table is distributed
// by scope_user_id, so the statement reaches one shard
// (store_pg_pool_statements_test.go pins it).
//
// $1 id, $2 attempt, $3 scope, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token, $8 key, $9 endpoint, $10 derive key id, $11 grace.
const TakeoverSQL = TakenCTE + `
SELECT ` + Columns + ` FROM taken`

// TakenCTE is the takeover's fenced UPDATE as a CTE named taken, shared
// by TakeoverSQL and a transactional route's TxTakeoverSQL, which
// differ only in how they compute the flags.
const TakenCTE = `WITH taken AS (
	UPDATE idempotency_keys SET
		attempt = attempt + 1,
		request_hash = decode($4, 'hex'),
		status = 'in_flight',
		response_code = NULL,
		response_body = NULL,
		response_body_raw = NULL,
		response_headers = NULL,
		seal_key_id = NULL,
		created_at = now(),
		locked_at = now(),
		locked_until = now() + $6::interval,
		expires_at = now() + $5::interval,
		owner_token = $7::uuid,
		derive_key_id = CASE WHEN derive_key_id = '' THEN $10 ELSE derive_key_id END,
		retain_until = now() + $5::interval + $11::interval,
		purged = false
	WHERE scope_user_id = $3 AND idem_key = $8 AND scope_endpoint = $9 AND id = $1 AND attempt = $2 AND expires_at < now() AND retain_until < now()
		AND NOT (status = 'in_flight' AND locked_until >= now())
	RETURNING ` + StoredColumns + `, retain_until
)`

// CompleteSQL records the response, fenced on the owner's attempt. The
// body and headers are bytes, stored and replayed as they are.
//
// $1 id, $2 attempt, $3 scope, $4 status code, $5 JSON body, $6 raw body,
// $7 headers (JSON), $8 seal key id (NULL for a plaintext response),
// $9 key, $10 endpoint.
const CompleteSQL = `UPDATE idempotency_keys SET
	status = 'completed',
	response_code = $4,
	response_body = $5,
	response_body_raw = $6,
	response_headers = $7,
	seal_key_id = $8
WHERE scope_user_id = $3 AND idem_key = $9 AND scope_endpoint = $10 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// FailSQL marks the row failed, fenced on the owner's attempt.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const FailSQL = `UPDATE idempotency_keys SET status = 'failed'
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// ReleaseSQL deletes the row, fenced on the owner's attempt.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const ReleaseSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// RenewSQL extends a Heartbeat claim's lease (Store.Renew): fenced on the
// owner's attempt and owner token, and only while the lease still runs, so
// a lease that lapsed (a takeover may follow) is never revived.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint, $6 lease, $7 owner token.
const RenewSQL = `UPDATE idempotency_keys SET locked_until = now() + $6::interval
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2 AND owner_token = $7::uuid AND locked_until >= now()`

// ReleaseOwnerSQL deletes the key's row only while it is in_flight with
// the given owner token (Store.ReleaseOwner).
//
// $1 key, $2 scope, $3 endpoint, $4 owner token.
const ReleaseOwnerSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $2 AND idem_key = $1 AND scope_endpoint = $3
	AND status = 'in_flight' AND owner_token = $4::uuid`

// Cleanup runs two kinds of batch. PurgeSQL purges the responses of
// tombstones past expires_at; ExpiredBatchSQL and DeleteExpiredSQL (or
// CleanupSQL in one statement) delete rows past retain_until. Neither
// touches an in_flight row whose lease runs.

// Purgeable is the predicate of a tombstone cleanup purges: expired,
// retained past expires_at, not purged yet, and not in_flight (an owner
// may still record it; a row in flight has no response to purge).
// idx_idem_keys_purge is partial on retain_until > expires_at AND NOT
// purged, so a batch never reads a row purged before, and names no column
// the record writes, so the record stays a HOT update.
const Purgeable = `expires_at < now() AND retain_until > expires_at AND NOT purged
	AND status <> 'in_flight'`

// purgeSet is what a purge writes: the response gone (the key, scope,
// endpoint, request hash, status and response code stay), and the row
// out of idx_idem_keys_purge.
const purgeSet = `response_body = NULL, response_body_raw = NULL, response_headers = NULL, seal_key_id = NULL, purged = true`

// PurgeBatchSQL reads one batch of at most $1 tombstones whose response
// cleanup purges, earliest expiry first, as ExpiredBatchSQL reads rows to
// delete; PurgeScopeSQL purges those of one scope.
//
// $1 batch size.
const PurgeBatchSQL = `SELECT scope_user_id, idem_key, scope_endpoint FROM idempotency_keys
WHERE ` + Purgeable + `
ORDER BY expires_at
LIMIT $1`

// PurgeScopeSQL purges the rows of one scope PurgeBatchSQL read (purgeSet:
// DESIGN.md "Keys in time"). It repeats the predicate, as DeleteExpiredSQL
// does.
//
// $1 scope, $2 keys, $3 their endpoints.
const PurgeScopeSQL = `UPDATE idempotency_keys SET ` + purgeSet + `
WHERE scope_user_id = $1
	AND (idem_key, scope_endpoint) IN (SELECT * FROM unnest($2::text[], $3::text[]))
	AND ` + Purgeable

// PurgeSQL is PurgeBatchSQL and its update in one statement, for a store
// outside Citus (sqlstore's PostgreSQL dialect), as CleanupSQL is.
//
// $1 batch size.
const PurgeSQL = `WITH batch AS (
` + PurgeBatchSQL + `
)
UPDATE idempotency_keys t SET ` + purgeSet + `
FROM batch b
WHERE t.scope_user_id = b.scope_user_id AND t.idem_key = b.idem_key AND t.scope_endpoint = b.scope_endpoint
	AND t.expires_at < now() AND t.retain_until > t.expires_at AND NOT t.purged
	AND t.status <> 'in_flight'`

// ExpiredBatchSQL reads one batch of rows cleanup may delete: past
// retain_until (expires_at, or expires_at + grace for a tombstone), and not
// in_flight inside their lease; earliest first, through
// idx_idem_keys_retain (never by id: ids made on different Citus nodes are
// not ordered by time). It takes no row lock: FOR UPDATE SKIP LOCKED fails
// on Citus when it spans shards.
//
// $1 batch size.
const ExpiredBatchSQL = `SELECT scope_user_id, idem_key, scope_endpoint FROM idempotency_keys
WHERE retain_until < now() AND expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
ORDER BY retain_until
LIMIT $1`

// DeleteExpiredSQL deletes the rows of one scope that ExpiredBatchSQL
// read. It repeats the predicate: a row may have been taken over or
// deleted between the read and the delete, and an in_flight row whose
// lease runs is never deleted. It names one scope, so on Citus it reaches
// one shard.
//
// $1 scope, $2 keys, $3 their endpoints (one row: keys[i], endpoints[i]).
const DeleteExpiredSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $1
	AND (idem_key, scope_endpoint) IN (SELECT * FROM unnest($2::text[], $3::text[]))
	AND retain_until < now() AND expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())`

// CleanupSQL is ExpiredBatchSQL and its delete in one statement, for a
// store outside Citus (sqlstore's PostgreSQL dialect): the delete repeats
// the predicate, as DeleteExpiredSQL does.
//
// $1 batch size.
const CleanupSQL = `WITH batch AS (
` + ExpiredBatchSQL + `
)
DELETE FROM idempotency_keys t USING batch b
WHERE t.scope_user_id = b.scope_user_id AND t.idem_key = b.idem_key AND t.scope_endpoint = b.scope_endpoint
	AND t.retain_until < now() AND t.expires_at < now() AND NOT (t.status = 'in_flight' AND t.locked_until >= now())`

// EraseDeleteSQL and EraseKeptSQL are DeleteScopeSQL in two statements,
// both at one instant read before them ($2), for a store whose driver
// cannot scan DeleteScopeSQL's NULL record (sqlstore, in one transaction).
//
// $1 scope, $2 the instant.
const EraseDeleteSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $1 AND NOT (status = 'in_flight' AND locked_until >= $2)`

// EraseKeptSQL reads the rows EraseDeleteSQL kept, oldest first.
//
// $1 scope, $2 the instant.
const EraseKeptSQL = `SELECT ` + Columns + ` FROM idempotency_keys
WHERE scope_user_id = $1 AND status = 'in_flight' AND locked_until >= $2
ORDER BY created_at, id`

// DeleteScopeSQL erases a user scope and reports the rows it left, in one
// statement: the DELETE and the SELECT share one snapshot and one now(), so
// every row of the scope is either counted as deleted or returned as
// skipped. It always returns at least one row; when nothing was skipped, the
// row's record columns are NULL.
//
// $1 scope.
const DeleteScopeSQL = `WITH del AS (
	DELETE FROM idempotency_keys
	WHERE scope_user_id = $1 AND NOT (status = 'in_flight' AND locked_until >= now())
	RETURNING id
), kept AS (
	SELECT ` + Columns + ` FROM idempotency_keys
	WHERE scope_user_id = $1 AND status = 'in_flight' AND locked_until >= now()
)
SELECT (SELECT count(*) FROM del), kept.*
FROM (SELECT 1) AS one LEFT JOIN kept ON true
ORDER BY kept.created_at, kept.id`

// ExportScopeSQL reads a user scope, oldest first.
//
// $1 scope.
const ExportScopeSQL = `SELECT ` + Columns + ` FROM idempotency_keys
WHERE scope_user_id = $1
ORDER BY created_at, id`

// NowSQL reads the database's clock.
const NowSQL = `SELECT now()`

// The statements of a transactional route's claim. (DESIGN.md
// "Transactional routes: one transaction"). They run pipelined in one
// batch with BEGIN (store_pg_tx.go): the session's state read
// (TxSessionSQL), the server-side bounds of a vanished owner
// (TxBoundsSQL), the lock wait (a literal SET LOCAL, built by
// pgSetLocal), the claim, the savepoint the failure paths roll back to,
// and the session's lock_timeout back. No RETURNING list calls a function
// that is not IMMUTABLE or reads a setting: Citus refuses the first, and
// evaluates RETURNING on a worker, which cannot see a coordinator's
// setting. The lock wait is SET LOCAL, never set_config, which never
// reaches Citus's workers.

// TxSessionSQL reads the session's state a transactional route depends
// on: at BEGIN (what the record and COMMIT run with, and what the
// connection goes back to the pool with), and again after COMMIT.
const TxSessionSQL = `SELECT current_setting('role'), current_setting('search_path'),
	current_setting('synchronous_commit'), current_setting('statement_timeout'),
	current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'),
	current_user::text`

// TxBoundsSQL is TxSessionSQL for a claim, followed by the bounds
// it sets, for this transaction only, on statement_timeout and
// idle_in_transaction_session_timeout, so that a vanished owner's session
// ends: the smaller of the lease and the session's own bound wins, 0 (no
// bound) counting as the largest. It returns both bounds as set. They
// matter on the coordinator only, so set_config may set them (a parameter
// cannot follow SET LOCAL). The session's state is read first (OFFSET 0
// keeps its subquery a plan node of its own).
//
// $1 lease (text, such as "10000ms").
const TxBoundsSQL = `SELECT session.*,
	set_config('statement_timeout', CASE WHEN st::interval > '0' AND st::interval <= $1::text::interval THEN st ELSE $1::text END, true),
	set_config('idle_in_transaction_session_timeout', CASE WHEN it::interval > '0' AND it::interval <= $1::text::interval THEN it ELSE $1::text END, true)
FROM (SELECT current_setting('role'), current_setting('search_path'), current_setting('synchronous_commit'),
	current_setting('statement_timeout') AS st, current_setting('lock_timeout'),
	current_setting('idle_in_transaction_session_timeout') AS it, current_user::text OFFSET 0) AS session`

// TxColumns are the columns a transactional claim returns for the row
// it now owns: fresh, so neither expired nor past its lease (constants,
// not now(): RETURNING).
const TxColumns = `request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at, derive_key_id,
	false AS expired, false AS lease_over, false AS tombstone`

// TxClaimSQL is a transactional route's claim: the INSERT alone, without
// ClaimSQL's read of an existing row. Inside the route's transaction the
// winner is the common case (a miss runs the handler), and this statement
// costs it less than the CTE (measured with pgbench, 16 clients, the
// example's order transaction: 5,600 tps against 5,140-5,370); a loser
// reads the row with TxReadSQL, a second statement. No owner-token win:
// a transactional claim is never retried after a lost connection (its
// transaction rolled back with it). A claim that inserted nothing returns
// nothing.
//
// $1 key, $2 scope, $3 endpoint, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token (NULL for none), $8 derive key id (empty for none), $9 grace.
const TxClaimSQL = `INSERT INTO idempotency_keys
	(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	 created_at, locked_at, locked_until, expires_at, owner_token, derive_key_id, retain_until)
VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1,
	now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid, $8, now() + $5::interval + $9::interval)
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
RETURNING id, ` + TxColumns + `, true AS won`

// TxReadSQL reads the key's existing row for a transactional claim that
// lost. At READ COMMITTED it takes a new snapshot, so it sees a row whose
// owner committed while the claim waited.
//
// $1 key, $2 scope, $3 endpoint.
const TxReadSQL = `SELECT ` + ClaimColumns + `, false AS won FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3`

// TxTakeoverSQL is TakeoverSQL inside a transactional route's
// transaction, with the same UPDATE (TakenCTE): the row it returns is
// fresh, so its flags are constants, as in TxColumns.
const TxTakeoverSQL = TakenCTE + `
SELECT ` + StoredColumns + `, false AS expired, false AS lease_over, false AS tombstone FROM taken`

// TxRestoreSQL puts back, for the rest of the transaction, the claim's
// statement_timeout (first: the statements after it run under it), the
// search_path and the claim's idle bound the record and COMMIT run with,
// whatever the handler set (set_config parses a search_path list as SET
// would); the role, synchronous_commit and lock_timeout go back with SET
// LOCAL (pgSetLocal).
//
// $1 statement_timeout, $2 search_path, $3 idle_in_transaction_session_timeout.
const TxRestoreSQL = `SELECT set_config('statement_timeout', $1, true), set_config('search_path', $2, true),
	set_config('idle_in_transaction_session_timeout', $3, true)`

// SessionRestoreSQL is TxRestoreSQL for the session, after COMMIT: a
// handler's SET without LOCAL outlives its transaction.
const SessionRestoreSQL = `SELECT set_config('search_path', $1, false), set_config('statement_timeout', $2, false),
	set_config('idle_in_transaction_session_timeout', $3, false)`

// SavepointSQL marks the point the failure paths roll back to: the key
// is owned, the handler has not written yet.
const SavepointSQL = `SAVEPOINT idempotency_claim`

// RollbackToSavepointSQL undoes the handler's writes and keeps the claim.
const RollbackToSavepointSQL = `ROLLBACK TO SAVEPOINT idempotency_claim`

// TxCompleteSQL is CompleteSQL for a transactional route, pipelined
// with COMMIT: when no row matches (the handler changed or deleted the
// key's row), the guard divides by zero, so the batch stops before its
// COMMIT instead of committing the handler's writes without a record.
const TxCompleteSQL = `WITH rec AS (` + CompleteSQL + `
RETURNING 1)
SELECT 1 / count(*)::int FROM rec`

// TxFailSQL is FailSQL with TxCompleteSQL's guard.
const TxFailSQL = `WITH rec AS (` + FailSQL + `
RETURNING 1)
SELECT 1 / count(*)::int FROM rec`

// CommitSQL commits a transactional route's transaction.
const CommitSQL = `COMMIT`

// ImmediateSQL checks every deferred constraint now, before the record:
// a violation then fails where a failed record can still be written,
// instead of at COMMIT, where the claim would vanish with it.
const ImmediateSQL = `SET CONSTRAINTS ALL IMMEDIATE`

// EndLeaseSQL ends the lease of a claim a handler committed with its own
// COMMIT (RouteTx.EndLease), fenced on the owner's attempt, and changes
// nothing else: the retry answers idempotency_outcome_unknown.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const EndLeaseSQL = `UPDATE idempotency_keys SET locked_until = now()
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// ReconcileClaimSQL takes a reconcile claim on a stale row
// (Store.ClaimStale): fenced on the attempt seen, only while the row is
// in_flight with its lease over, it moves the attempt on and sets a new
// lease and owner token, keeping everything else (the hash, the expiry,
// when it was claimed). One reconciler at a time: a second finds the
// attempt moved on. The flags are computed over the CTE, as in
// TakeoverSQL.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint, $6 lease, $7 owner
// token.
const ReconcileClaimSQL = `WITH taken AS (
	UPDATE idempotency_keys SET
		attempt = attempt + 1,
		locked_at = now(),
		locked_until = now() + $6::interval,
		owner_token = $7::uuid
	WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1 AND attempt = $2
		AND status = 'in_flight' AND locked_until < now()
	RETURNING ` + StoredColumns + `, retain_until
)
SELECT ` + Columns + ` FROM taken`

// StaleSQL reads at most $2 stale rows of the endpoint $1 (Store.Stale):
// in_flight with their lease over, the longest stale first.
const StaleSQL = `SELECT ` + Columns + ` FROM idempotency_keys
WHERE scope_endpoint = $1 AND status = 'in_flight' AND locked_until < now()
ORDER BY locked_until, id
LIMIT $2`

// CheckSQL reads, for the table $1 names (idempotency_keys as the
// connection's search_path finds it, or the store's resolved table), its
// columns, whether the unique constraint the claim's ON CONFLICT needs
// exists on exactly the key's three columns, and its schema-qualified name.
// No row: there is no such table.
const CheckSQL = `SELECT
	ARRAY(SELECT attname::text FROM pg_attribute
		WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
	EXISTS (SELECT 1 FROM pg_constraint k
		WHERE k.conrelid = c.oid AND k.contype IN ('u', 'p')
			AND ARRAY(SELECT a.attname::text FROM pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum = ANY(k.conkey) ORDER BY a.attname)
				= ARRAY['idem_key', 'scope_endpoint', 'scope_user_id']),
	ARRAY(SELECT attname::text FROM pg_attribute
		WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped AND atttypid = 'bytea'::regtype),
	format('%s.%I', c.relnamespace::regnamespace, c.relname)
FROM pg_class c
WHERE c.oid = to_regclass($1)`

// TableSQL resolves $1, a table name, as a statement naming it would
// (through the connection's search_path), to its schema-qualified name,
// quoted where needed. No row: no such table.
const TableSQL = `SELECT format('%s.%I', relnamespace::regnamespace, relname) FROM pg_class WHERE oid = to_regclass($1)`

// ProbeSQL is the outage probe's statement.
const ProbeSQL = `SELECT 1`

// The wake-ups of duplicates that wait (RouteConfig.WaitInFlight): one
// listening connection per store hears them (ListenSQL); after a record
// commits, its connection sends WakeSQL with the row's id in a transaction
// of its own, never in the record's (a NOTIFY serialises the commits that
// send one), unflushed (a wake-up needs no durability); NotifySQL sends a
// listener's test notification through the pool. On Citus all three run on
// the coordinator.

// ListenSQL subscribes a session to the wake-ups.
const ListenSQL = `LISTEN idempotency`

// WakeSQL wakes the waiters of one row: a format for its id (%d), sent in
// the simple protocol as one message.
const WakeSQL = `BEGIN; SET LOCAL synchronous_commit = off; SELECT pg_notify('idempotency', '%d'); COMMIT`

// NotifySQL sends a payload on the wake-ups' channel.
//
// $1 payload.
const NotifySQL = `SELECT pg_notify('idempotency', $1)`

// Group commit (PostgresStore's batches): the claims, and the records, of
// concurrent calls in one statement and one commit. The batcher merges calls
// for one key (or one row) before, so a batch names each at most once, and
// runs the statement in BEGIN; SET LOCAL lock_timeout; ...; COMMIT. Batching
// is off on Citus, where a batch would span shards.

// ClaimBatchSQL is ClaimSQL for several keys: one INSERT of every key in
// (scope_user_id, idem_key, scope_endpoint) order, so that concurrent
// batches lock in one order, then the read of each existing row it did not
// insert. Each result row names its key; a key with no row (its conflicting
// row committed after the statement's snapshot) is claimed again alone.
//
// $1 keys, $2 scopes, $3 endpoints, $4 request hashes (hex), $5 TTLs,
// $6 leases, $7 owner tokens (text, NULL for none), $8 derive key ids,
// $9 graces: arrays of one length, a key each.
const ClaimBatchSQL = `WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::interval[], $6::interval[], $7::text[], $8::text[], $9::interval[])
		AS t(idem_key, scope_user_id, scope_endpoint, in_hash, in_ttl, in_lease, in_owner, in_derive, in_grace)
), ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, owner_token, derive_key_id, retain_until)
	SELECT idem_key, scope_user_id, scope_endpoint, decode(in_hash, 'hex'), 'in_flight', 1,
		now(), now(), now() + in_lease, now() + in_ttl, in_owner::uuid, in_derive, now() + in_ttl + in_grace
	FROM input ORDER BY scope_user_id, idem_key, scope_endpoint
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING idem_key, scope_user_id, scope_endpoint, ` + ClaimStoredColumns + `, retain_until
)
SELECT idem_key, scope_user_id, scope_endpoint, ` + ClaimColumns + `, true AS won FROM ins
UNION ALL
SELECT idem_key, scope_user_id, scope_endpoint, ` + ClaimColumns + `,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = in_owner::uuid) IS TRUE AS won
FROM input JOIN idempotency_keys USING (idem_key, scope_user_id, scope_endpoint)
WHERE NOT EXISTS (SELECT 1 FROM ins
	WHERE ins.idem_key = input.idem_key AND ins.scope_user_id = input.scope_user_id AND ins.scope_endpoint = input.scope_endpoint)`

// CompleteBatchSQL is CompleteSQL for several rows, each fenced on its own
// id and attempt; it returns the id of each row it recorded (a row not
// returned is no longer its caller's).
//
// $1 ids, $2 attempts, $3 scopes, $4 keys, $5 endpoints, $6 status codes,
// $7 JSON bodies, $8 raw bodies, $9 headers, $10 seal key ids: arrays of
// one length, a row each.
const CompleteBatchSQL = `UPDATE idempotency_keys SET
	status = 'completed',
	response_code = in_code,
	response_body = in_body,
	response_body_raw = in_raw,
	response_headers = in_headers,
	seal_key_id = in_seal
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], $6::int2[], $7::bytea[], $8::bytea[], $9::bytea[], $10::text[])
	AS input(in_id, in_attempt, in_scope, in_key, in_endpoint, in_code, in_body, in_raw, in_headers, in_seal)
WHERE scope_user_id = in_scope AND idem_key = in_key AND scope_endpoint = in_endpoint AND id = in_id
	AND status = 'in_flight' AND attempt = in_attempt
RETURNING id`

// RoundSettingsSQL makes a batch's settings, for its transaction alone
// (set_config(..., true) is SET LOCAL), in one statement: its lock waits
// bounded by $1 (lock_timeout's text, the transactional wait bound), no
// sequential scans, and from PostgreSQL 12 on the plans a connection keeps.
//
// The batch statements find every row by its primary key, but a
// connection keeps the plan PostgreSQL makes once it stops planning each
// call, and one made while the table was small scans the table, every
// batch, however large the table grows (until the table is analyzed
// again, never when autovacuum is off): enable_seqscan is off. A batch's
// arrays are small and their lengths known when PostgreSQL plans for one
// call, so a plan for the call looks cheaper than the kept one and
// PostgreSQL would plan every batch afresh, a third of its CPU per key:
// plan_cache_mode is force_generic_plan.
const RoundSettingsSQL = `SELECT set_config('lock_timeout', $1, true), set_config('enable_seqscan', 'off', true),
	(SELECT set_config('plan_cache_mode', 'force_generic_plan', true)` + fromPG12 + `)`

// CustomPlanSQL makes a cleanup batch's transaction plan its statements
// for the call (sqlstore's PostgreSQL dialect, whose driver may prepare
// them): CleanupSQL and PurgeSQL take their batch size as a parameter, and
// a plan kept from when the table was small joins a batch to every expired
// row, while one made for the call finds the batch's rows by key.
const CustomPlanSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)` + fromPG12

// fromPG12 limits RoundSettingsSQL's plan setting and CustomPlanSQL to
// PostgreSQL 12 or newer, where plan_cache_mode exists: on an older server
// the condition is false and set_config is never called (a SET there would
// fail, 42704, every batch). set_config(..., true) is SET LOCAL.
const fromPG12 = `
WHERE current_setting('server_version_num')::int >= 120000`

// CitusSQL reports whether the citus extension is installed (Check): only
// then does CitusTableSQL, which reads its catalog, run.
const CitusSQL = `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`

// CitusTableSQL reports whether the table Check found is distributed by
// Citus: group commit is then off.
//
// $1 the table's qualified name.
const CitusTableSQL = `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`
