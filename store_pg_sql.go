package idempotency

// The statements of PostgresStore, and how often one is retried.

// pgRetries bounds how many times a statement is run again when it read no
// row because of a concurrent commit, or failed with a serialization failure.
const pgRetries = 5

// pgStoredColumns are a row's columns as stored, in the order scanRecord
// reads them.
// request_hash is its 32 bytes: the store reads them as the lower-case hex
// it compares (scanRecord).
const pgStoredColumns = `id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at`

// pgFlags are the two flags scanRecord reads after the stored columns,
// computed against the database's clock. Never in a RETURNING list:
// Citus refuses a function that is not IMMUTABLE there (now() is not), so
// a statement that writes returns the stored columns and an outer SELECT
// over its CTE computes the flags, on the coordinator.
const pgFlags = `expires_at < now() AS expired, locked_until < now() AS lease_over`

// pgColumns are the columns every statement returning rows returns, in the
// order scanRecord reads them.
const pgColumns = pgStoredColumns + `,
	` + pgFlags

// pgClaimStoredColumns are pgStoredColumns without the key, scope and
// endpoint, which a claim already knows: the hot path decodes three
// strings fewer.
const pgClaimStoredColumns = `id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at`

// pgClaimColumns are pgClaimStoredColumns and pgFlags.
const pgClaimColumns = pgClaimStoredColumns + `,
	` + pgFlags

// pgClaimSQL inserts a new in_flight row or, when the key exists, reads the
// existing row, in one statement. The read shares the INSERT's snapshot, so
// when the conflicting row was committed after the statement began (or was
// deleted), it returns no row and the caller runs the statement again.
// ON CONFLICT DO NOTHING never locks or writes the existing row, so replays
// of one key never queue behind each other. The flags (pgFlags) are
// computed over the CTE, not in its RETURNING list, for Citus.
//
// The existing row counts as won when it is the caller's own claim: in
// flight, inside its lease and holding the caller's owner token (a claim
// whose reply was lost, run again by retryConnLoss or by the caller). A
// NULL token (none given, or a row of another writer) never matches.
//
// $1 key, $2 scope, $3 endpoint, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token (NULL for none).
const pgClaimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, owner_token)
	VALUES ($1, $2, $3, decode($4, 'hex'), 'in_flight', 1,
		now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING ` + pgClaimStoredColumns + `
)
SELECT ` + pgClaimColumns + `, true AS won FROM ins
UNION ALL
SELECT ` + pgClaimColumns + `,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $7::uuid) IS TRUE AS won
FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3
	AND NOT EXISTS (SELECT 1 FROM ins)`

// pgTakeoverSQL turns an expired row into a fresh claim, fenced on attempt.
// An in_flight row whose lease still runs is left to its owner even when
// expired (instances with different TTL and lease settings can produce one).
// The new owner's token replaces the old one (NULL when it gave none). The
// flags are computed over the CTE, as in pgClaimSQL.
//
// Every fenced statement finds its row by the primary key (scope_user_id,
// idem_key, scope_endpoint), and checks the id (a key released and claimed
// again is another row) and the attempt; on Citus the table is distributed
// by scope_user_id, so the statement reaches one shard
// (store_pg_sql_test.go pins it).
//
// $1 id, $2 attempt, $3 scope, $4 request hash (hex), $5 TTL, $6 lease,
// $7 owner token, $8 key, $9 endpoint.
const pgTakeoverSQL = pgTakenCTE + `
SELECT ` + pgColumns + ` FROM taken`

// pgTakenCTE is the takeover's fenced UPDATE as a CTE named taken, shared
// by pgTakeoverSQL and a transactional route's pgTxTakeoverSQL, which
// differ only in how they compute the flags.
const pgTakenCTE = `WITH taken AS (
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
		owner_token = $7::uuid
	WHERE scope_user_id = $3 AND idem_key = $8 AND scope_endpoint = $9 AND id = $1 AND attempt = $2 AND expires_at < now()
		AND NOT (status = 'in_flight' AND locked_until >= now())
	RETURNING ` + pgStoredColumns + `
)`

// pgCompleteSQL records the response, fenced on the owner's attempt. The
// body and headers are bytes, stored and replayed as they are.
//
// $1 id, $2 attempt, $3 scope, $4 status code, $5 JSON body, $6 raw body,
// $7 headers (JSON), $8 seal key id (NULL for a plaintext response),
// $9 key, $10 endpoint.
const pgCompleteSQL = `UPDATE idempotency_keys SET
	status = 'completed',
	response_code = $4,
	response_body = $5,
	response_body_raw = $6,
	response_headers = $7,
	seal_key_id = $8
WHERE scope_user_id = $3 AND idem_key = $9 AND scope_endpoint = $10 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// pgFailSQL marks the row failed, fenced on the owner's attempt.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const pgFailSQL = `UPDATE idempotency_keys SET status = 'failed'
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// pgReleaseSQL deletes the row, fenced on the owner's attempt.
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const pgReleaseSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1
	AND status = 'in_flight' AND attempt = $2`

// pgReleaseOwnerSQL deletes the key's row only while it is in_flight with
// the given owner token (see OwnerReleaser).
//
// $1 key, $2 scope, $3 endpoint, $4 owner token.
const pgReleaseOwnerSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $2 AND idem_key = $1 AND scope_endpoint = $3
	AND status = 'in_flight' AND owner_token = $4::uuid`

// pgExpiredBatchSQL reads one batch of rows cleanup may delete: expired,
// and not in_flight inside their lease; earliest expiry first (never by
// id: ids made on different Citus nodes are not ordered by time). It takes
// no row lock: FOR UPDATE SKIP LOCKED fails on Citus when it spans shards.
//
// $1 batch size.
const pgExpiredBatchSQL = `SELECT scope_user_id, idem_key, scope_endpoint FROM idempotency_keys
WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
ORDER BY expires_at
LIMIT $1`

// pgDeleteExpiredSQL deletes the rows of one scope that pgExpiredBatchSQL
// read. It repeats the predicate: a row may have been taken over or
// deleted between the read and the delete, and an in_flight row whose
// lease runs is never deleted. It names one scope, so on Citus it reaches
// one shard.
//
// $1 scope, $2 keys, $3 their endpoints (one row: keys[i], endpoints[i]).
const pgDeleteExpiredSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $1
	AND (idem_key, scope_endpoint) IN (SELECT * FROM unnest($2::text[], $3::text[]))
	AND expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())`

// pgDeleteScopeSQL erases a user scope and reports the rows it left, in one
// statement: the DELETE and the SELECT share one snapshot and one now(), so
// every row of the scope is either counted as deleted or returned as
// skipped. It always returns at least one row; when nothing was skipped, the
// row's record columns are NULL.
//
// $1 scope.
const pgDeleteScopeSQL = `WITH del AS (
	DELETE FROM idempotency_keys
	WHERE scope_user_id = $1 AND NOT (status = 'in_flight' AND locked_until >= now())
	RETURNING id
), kept AS (
	SELECT ` + pgColumns + ` FROM idempotency_keys
	WHERE scope_user_id = $1 AND status = 'in_flight' AND locked_until >= now()
)
SELECT (SELECT count(*) FROM del), kept.*
FROM (SELECT 1) AS one LEFT JOIN kept ON true
ORDER BY kept.created_at, kept.id`

// pgExportScopeSQL reads a user scope, oldest first.
//
// $1 scope.
const pgExportScopeSQL = `SELECT ` + pgColumns + ` FROM idempotency_keys
WHERE scope_user_id = $1
ORDER BY created_at, id`

// pgLookupSQL reads the rows of one key in one scope, by endpoint, with the
// database's now() last.
//
// $1 key, $2 scope, $3 endpoint or NULL for all.
const pgLookupSQL = `SELECT ` + pgColumns + `, now() FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND ($3::text IS NULL OR scope_endpoint = $3)
ORDER BY scope_endpoint`

// pgNowSQL reads the database's clock.
const pgNowSQL = `SELECT now()`

// pgStatsSQL counts the table in one scan; the awaiting-cleanup columns
// repeat pgExpiredBatchSQL's predicate.
const pgStatsSQL = `SELECT
	count(*),
	count(*) FILTER (WHERE status = 'in_flight'),
	count(*) FILTER (WHERE status = 'completed'),
	count(*) FILTER (WHERE status = 'failed'),
	extract(epoch FROM now() - min(locked_at) FILTER (WHERE status = 'in_flight'))::float8,
	count(*) FILTER (WHERE status = 'in_flight' AND locked_until < now()),
	count(*) FILTER (WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())),
	extract(epoch FROM now() - min(expires_at) FILTER (WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())))::float8
FROM idempotency_keys`

// pgCountCleanupSQL counts the rows pgExpiredBatchSQL would read, with its
// predicate.
const pgCountCleanupSQL = `SELECT count(*) FROM idempotency_keys
WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())`
