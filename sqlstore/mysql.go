package sqlstore

import (
	"strings"
	"time"
)

// The MySQL/MariaDB statements (docs/sql.md says why each is as it is).
// Every time is the server's UTC_TIMESTAMP(6), which is constant within a
// statement, so created_at, locked_at, locked_until and expires_at of one
// claim come from one instant; never NOW() (whole seconds, the session's
// time_zone). Every statement names the table qualified (db.table), so a
// handler's USE cannot send a claim to another table. Intervals are bound
// as whole microseconds.

// mysqlNow is the server's clock in every MySQL statement.
const mysqlNow = `UTC_TIMESTAMP(6)`

// mysqlColumns are a row's columns, in the order scanRecord reads them,
// with the three flags computed against the server's clock (pgsql.Flags).
const mysqlColumns = mysqlStored + `,
	expires_at < ` + mysqlNow + ` AS expired, locked_until < ` + mysqlNow + ` AS lease_over,
	(expires_at < ` + mysqlNow + ` AND retain_until > expires_at AND retain_until >= ` + mysqlNow + `) AS tombstone`

// mysqlStored are a row's stored columns.
const mysqlStored = `id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at, derive_key_id`

// mysqlStatements are the MySQL dialect's statements for one table.
func mysqlStatements(table string) statements {
	r := strings.NewReplacer("T_", table, "NOW_", mysqlNow, "COLS_", mysqlColumns, "STORED_", mysqlStored)
	q := func(s string) string { return r.Replace(s) }
	return statements{
		// A plain INSERT: a duplicate fails with 1062, which ends only the
		// statement, never the transaction; never INSERT IGNORE (it turns
		// truncation and invalid values into warnings) nor REPLACE.
		// ? key, scope, endpoint, hash, lease µs, TTL µs, owner token,
		// derive key id, TTL + grace µs.
		insert: q(`INSERT INTO T_
	(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	 created_at, locked_at, locked_until, expires_at, owner_token, derive_key_id, retain_until)
VALUES (?, ?, ?, ?, 'in_flight', 1, NOW_, NOW_, NOW_ + INTERVAL ? MICROSECOND, NOW_ + INTERVAL ? MICROSECOND, ?, ?,
	NOW_ + INTERVAL ? MICROSECOND)`),
		// The key's row, and whether it is the caller's own live claim
		// (? owner token; NULL never matches). ? key, scope, endpoint.
		readKey: q(`SELECT COLS_,
	COALESCE(status = 'in_flight' AND locked_until >= NOW_ AND owner_token = ?, FALSE) AS won
FROM T_ WHERE idem_key = ? AND scope_user_id = ? AND scope_endpoint = ?`),
		// The row a claim or takeover just made, by id: fresh, so neither
		// expired nor past its lease (constants: a later clock could
		// already say otherwise for a tiny TTL). ? id, scope.
		readID: q(`SELECT STORED_, FALSE, FALSE, FALSE, TRUE AS won FROM T_ WHERE id = ? AND scope_user_id = ?`),
		// ? hash, lease µs, TTL µs, owner, derive key id, TTL + grace µs,
		// id, scope, attempt. The row's derive key id stays, set only
		// where ""; a row past retain_until: a tombstone after its grace.
		takeover: q(`UPDATE T_ SET
	attempt = attempt + 1, request_hash = ?, status = 'in_flight',
	response_code = NULL, response_body = NULL, response_body_raw = NULL, response_headers = NULL, seal_key_id = NULL,
	created_at = NOW_, locked_at = NOW_, locked_until = NOW_ + INTERVAL ? MICROSECOND, expires_at = NOW_ + INTERVAL ? MICROSECOND,
	owner_token = ?, derive_key_id = IF(derive_key_id = '', ?, derive_key_id), retain_until = NOW_ + INTERVAL ? MICROSECOND
WHERE id = ? AND scope_user_id = ? AND attempt = ? AND expires_at < NOW_ AND retain_until < NOW_
	AND NOT (status = 'in_flight' AND locked_until >= NOW_)`),
		// ? code, JSON body, raw body, headers, seal key id, id, scope, attempt.
		complete: q(`UPDATE T_ SET status = 'completed',
	response_code = ?, response_body = ?, response_body_raw = ?, response_headers = ?, seal_key_id = ?
WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ?`),
		fail:    q(`UPDATE T_ SET status = 'failed' WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ?`),
		release: q(`DELETE FROM T_ WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ?`),
		// endLease ends an in_flight row's lease now; fail's arguments.
		endLease: q(`UPDATE T_ SET locked_until = ` + mysqlNow + ` WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ?`),
		// The reconcile claim of a stale row (pgsql.ReconcileClaimSQL).
		// ? lease µs, owner, id, scope, attempt.
		reconcileClaim: q(`UPDATE T_ SET attempt = attempt + 1, locked_at = NOW_, locked_until = NOW_ + INTERVAL ? MICROSECOND, owner_token = ?
WHERE id = ? AND scope_user_id = ? AND attempt = ? AND status = 'in_flight' AND locked_until < NOW_`),
		// ? endpoint, limit.
		stale: q(`SELECT COLS_, FALSE FROM T_ WHERE scope_endpoint = ? AND status = 'in_flight' AND locked_until < NOW_
ORDER BY locked_until, id LIMIT ?`),
		// renew extends a Heartbeat claim's lease while it runs, fenced on the
		// attempt and the owner token (pgsql.RenewSQL). ? lease µs, id, scope,
		// attempt, owner.
		renew: q(`UPDATE T_ SET locked_until = NOW_ + INTERVAL ? MICROSECOND
WHERE id = ? AND scope_user_id = ? AND status = 'in_flight' AND attempt = ? AND owner_token = ? AND locked_until >= NOW_`),
		// ? key, scope, endpoint, owner.
		releaseOwner: q(`DELETE FROM T_ WHERE idem_key = ? AND scope_user_id = ? AND scope_endpoint = ?
	AND status = 'in_flight' AND owner_token = ?`),
		// One batch, earliest first, through idx_idem_keys_retain. ? limit.
		cleanup: q(`DELETE FROM T_ WHERE retain_until < NOW_ AND expires_at < NOW_ AND NOT (status = 'in_flight' AND locked_until >= NOW_)
ORDER BY retain_until LIMIT ?`),
		// One batch of tombstones' responses, earliest expiry first, through
		// idx_idem_keys_expires (pgsql.Purgeable by the response columns:
		// MySQL has no partial index, and so no purged flag to keep one
		// small, so a batch reads the tombstones purged before too). ? limit.
		purge: q(`UPDATE T_ SET response_body = NULL, response_body_raw = NULL, response_headers = NULL, seal_key_id = NULL
WHERE expires_at < NOW_ AND retain_until > expires_at AND NOT (status = 'in_flight' AND locked_until >= NOW_)
	AND (response_body IS NOT NULL OR response_body_raw IS NOT NULL OR response_headers IS NOT NULL OR seal_key_id IS NOT NULL)
ORDER BY expires_at LIMIT ?`),
		now: q(`SELECT NOW_`),
		// ? scope, now.
		eraseDelete: q(`DELETE FROM T_ WHERE scope_user_id = ? AND NOT (status = 'in_flight' AND locked_until >= ?)`),
		eraseKept: q(`SELECT COLS_, FALSE FROM T_ WHERE scope_user_id = ? AND status = 'in_flight' AND locked_until >= ?
ORDER BY created_at, id`),
		export:            q(`SELECT COLS_, FALSE FROM T_ WHERE scope_user_id = ? ORDER BY created_at, id`),
		savepoint:         `SAVEPOINT idempotency_claim`,
		rollbackSavepoint: `ROLLBACK TO SAVEPOINT idempotency_claim`,
	}
}

// mysqlMicros is d as whole microseconds, the unit the statements' INTERVAL
// takes.
func mysqlMicros(d time.Duration) int64 { return d.Microseconds() }

// mariadbNoWait prefixes a statement that must not wait on a row lock:
// it fails at once with 1205 (lock wait timeout; the statement alone rolls
// back), and the caller tries again until its lock wait is over. Not
// max_statement_time, which bounds the statement's whole run: under load a
// claim that waits on nothing can take longer than a lock wait of a few
// milliseconds, and would be answered 409 for no owner at all.
//
// lock_wait_timeout=0 makes a wait on the table's metadata lock (DDL, a
// migration, LOCK TABLES) fail at once too, with the same 1205: the
// first 1205 of a claim is therefore told apart by tableProbe, never by
// the message's text.
const mariadbNoWait = "SET STATEMENT innodb_lock_wait_timeout=0, lock_wait_timeout=0 FOR "

// tableProbe takes the table's metadata lock for the transaction
// (MDL_SHARED_WRITE, what an INSERT takes, held until the transaction
// ends) without reading or locking a row: a 1205 on it is the table's
// lock; once it succeeded, a later 1205 in the transaction is a row's.
const tableProbe = `SELECT 1 FROM T_ WHERE FALSE FOR UPDATE`

// mysqlLockWaitSeconds is d rounded up to whole seconds, at least 1: the
// bound innodb_lock_wait_timeout can express on MySQL 8.0.
func mysqlLockWaitSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// mysqlQuote quotes an identifier.
func mysqlQuote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }
