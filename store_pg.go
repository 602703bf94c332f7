package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/storedbody"
)

// PostgresStore is a Store on a PostgreSQL table, idempotency_keys (see
// Migrate), reached through a pgx connection pool. Several processes sharing
// one database share its keys, so at most one of them runs a handler per key.
// Every time it stores or compares comes from the database's now(), so the
// clocks of the application servers never matter.
//
// A PostgresStore is safe for concurrent use. It finds the table through the
// pool connections' search_path.
type PostgresStore struct {
	pool *pgxpool.Pool
}

var (
	_ Store         = (*PostgresStore)(nil)
	_ OwnerReleaser = (*PostgresStore)(nil)
)

// NewPostgresStore returns a PostgresStore using pool. The pool stays the
// caller's: the store never closes it, and the caller closes it once the
// store and every middleware using it are done. Size the pool for the
// routes' concurrency; a call that cannot get a connection before its
// deadline fails as a timeout.
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore {
	return &PostgresStore{pool: pool}
}

// Pool returns the pool the store was constructed with, for work that must
// share the store's database, such as the transaction of a transactional
// route.
func (s *PostgresStore) Pool() *pgxpool.Pool { return s.pool }

// pgRetries bounds how many times a statement is run again when it read no
// row because of a concurrent commit, or failed with a serialization failure.
const pgRetries = 5

// pgColumns are the columns every statement returning rows returns, in the
// order scanRecord reads them. The last two are computed against the
// database's clock.
const pgColumns = `id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over, reclaimable`

// pgClaimColumns are pgColumns without the key, scope and endpoint, which
// a claim already knows: the hot path decodes three strings fewer.
const pgClaimColumns = `id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over, reclaimable`

// pgClaimSQL inserts a new in_flight row or, when the key exists, reads the
// existing row, in one statement. The read shares the INSERT's snapshot, so
// when the conflicting row was committed after the statement began (or was
// deleted), it returns no row and the caller runs the statement again.
// ON CONFLICT DO NOTHING never locks or writes the existing row, so replays
// of one key never queue behind each other.
//
// The existing row counts as won when it is the caller's own claim: in
// flight, inside its lease and holding the caller's owner token (a claim
// whose reply was lost, run again by retryConnLoss or by the caller). A
// NULL token (none given, or a row of another writer) never matches.
//
// $1 key, $2 scope, $3 endpoint, $4 request hash, $5 TTL, $6 lease,
// $7 reclaimable, $8 owner token (NULL for none).
const pgClaimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, reclaimable, owner_token)
	VALUES ($1, $2, $3, $4, 'in_flight', 1,
		now(), now(), now() + $6::interval, now() + $5::interval, $7, $8::uuid)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING ` + pgClaimColumns + `
)
SELECT *, true AS won FROM ins
UNION ALL
SELECT ` + pgClaimColumns + `,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $8::uuid) IS TRUE AS won
FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3
	AND NOT EXISTS (SELECT 1 FROM ins)`

// pgTakeoverSQL turns an expired row into a fresh claim, fenced on attempt.
// An in_flight row whose lease still runs is left to its owner even when
// expired (instances with different TTL and lease settings can produce one).
// The new owner's token replaces the old one (NULL when it gave none).
//
// Every fenced statement names scope_user_id: the primary key is
// (scope_user_id, id), and on Citus the table is distributed by it, so the
// statement reaches one shard (store_pg_citus_test.go pins it).
//
// $1 id, $2 attempt, $3 scope, $4 request hash, $5 TTL, $6 lease,
// $7 reclaimable, $8 owner token.
const pgTakeoverSQL = `UPDATE idempotency_keys SET
	attempt = attempt + 1,
	request_hash = $4,
	status = 'in_flight',
	response_code = NULL,
	response_body = NULL,
	response_body_raw = NULL,
	response_headers = NULL,
	created_at = now(),
	locked_at = now(),
	locked_until = now() + $6::interval,
	expires_at = now() + $5::interval,
	reclaimable = $7,
	owner_token = $8::uuid
WHERE scope_user_id = $3 AND id = $1 AND attempt = $2 AND expires_at < now()
	AND NOT (status = 'in_flight' AND locked_until >= now())
RETURNING ` + pgColumns

// pgReclaimSQL gives a stale in_flight row a new owner and lease, fenced on
// attempt. The expiry moves to a full TTL from now when that is later: a
// key reclaimed near the end of its TTL would otherwise expire with its
// new record, and the next retry would run as a new request.
//
// $1 id, $2 attempt, $3 scope, $4 lease, $5 TTL, $6 owner token.
const pgReclaimSQL = `UPDATE idempotency_keys SET
	attempt = attempt + 1,
	locked_at = now(),
	locked_until = now() + $4::interval,
	expires_at = GREATEST(expires_at, now() + $5::interval),
	owner_token = $6::uuid
WHERE scope_user_id = $3 AND id = $1 AND attempt = $2 AND status = 'in_flight' AND locked_until < now() AND reclaimable
RETURNING ` + pgColumns

// pgCompleteSQL records the response, fenced on the owner's attempt.
//
// $1 id, $2 attempt, $3 scope, $4 status code, $5 JSON body, $6 raw body,
// $7 headers.
const pgCompleteSQL = `UPDATE idempotency_keys SET
	status = 'completed',
	response_code = $4,
	response_body = $5,
	response_body_raw = $6,
	response_headers = $7
WHERE scope_user_id = $3 AND id = $1 AND status = 'in_flight' AND attempt = $2`

// pgFailSQL marks the row failed, fenced on the owner's attempt.
const pgFailSQL = `UPDATE idempotency_keys SET status = 'failed'
WHERE scope_user_id = $3 AND id = $1 AND status = 'in_flight' AND attempt = $2`

// pgReleaseSQL deletes the row, fenced on the owner's attempt.
const pgReleaseSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $3 AND id = $1 AND status = 'in_flight' AND attempt = $2`

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
const pgExpiredBatchSQL = `SELECT scope_user_id, id FROM idempotency_keys
WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
ORDER BY expires_at
LIMIT $1`

// pgDeleteExpiredSQL deletes the rows of one scope that pgExpiredBatchSQL
// read. It repeats the predicate: a row may have been taken over, reclaimed
// or deleted between the read and the delete, and an in_flight row whose
// lease runs is never deleted. It names one scope, so on Citus it reaches
// one shard.
//
// $1 scope, $2 ids.
const pgDeleteExpiredSQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $1 AND id = ANY($2::bigint[])
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

// errClaimVanished is the cause of a claim that kept reading no row.
var errClaimVanished = errors.New("the conflicting row was not visible after repeated attempts")

// Claim implements Store in one statement (pgClaimSQL): the winner's insert
// and the loser's read of the existing row take one round trip.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	var last error
	lossRetried := false // see retryConnLoss
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		row := s.pool.QueryRow(ctx, pgClaimSQL, claimArgs(req)...)
		err := scanClaim(row, req, &rec, &won)
		switch {
		case err == nil:
			return ClaimResult{Won: won, Record: rec}, nil
		case errors.Is(err, pgx.ErrNoRows):
			last = errClaimVanished
		case isRetryable(err):
			last = err
		case !lossRetried && isConnLoss(ctx, err):
			lossRetried, last = true, err
		default:
			return ClaimResult{}, pgStoreError("claim", err)
		}
		if err := ctx.Err(); err != nil {
			return ClaimResult{}, pgStoreError("claim", err)
		}
	}
	return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// claimArgs are pgClaimSQL's parameters for req, in order.
func claimArgs(req ClaimRequest) []any {
	return []any{req.Key, req.Scope, req.Endpoint, req.RequestHash, req.TTL, req.Lease, req.Reclaimable, ownerArg(req.Owner)}
}

// Takeover implements Store with one fenced UPDATE.
func (s *PostgresStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return s.claimExisting(ctx, "takeover", pgTakeoverSQL,
		f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, req.Reclaimable, ownerArg(req.Owner))
}

// Reclaim implements Store with one fenced UPDATE.
func (s *PostgresStore) Reclaim(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return s.claimExisting(ctx, "reclaim", pgReclaimSQL, f.ID, f.Attempt, f.Scope, req.Lease, req.TTL, ownerArg(req.Owner))
}

// claimExisting runs a fenced UPDATE ... RETURNING that makes the caller the
// new owner of an existing row; no row means another caller won.
func (s *PostgresStore) claimExisting(ctx context.Context, op, sql string, args ...any) (ClaimResult, error) {
	var rec Record
	err := retryConnLoss(ctx, func() error {
		return scanRecord(s.pool.QueryRow(ctx, sql, args...), &rec, nil)
	})
	switch {
	case err == nil:
		return ClaimResult{Won: true, Record: rec}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return ClaimResult{}, nil
	default:
		return ClaimResult{}, pgStoreError(op, err)
	}
}

// Complete implements Store with one fenced UPDATE. A BodyJSON body goes to
// the JSONB column, and reads back as the same JSON value in Postgres's own
// text form (key order and white space normalised). A JSON body that JSONB
// cannot hold (a \u0000 escape, which JSONB refuses) is stored byte for byte
// in the raw column, with the jsonStoredRaw marker in the JSONB column, and
// reads back as the same BodyJSON bytes. A BodyRaw body, empty included, is
// stored byte for byte; BodyNone stores no body.
func (s *PostgresStore) Complete(ctx context.Context, f Fence, resp Response) error {
	jsonBody, rawBody, headers, err := completeArgs(resp, false)
	if err != nil {
		return err
	}
	exec := func() error {
		return fenced(ctx, s.pool, pgCompleteSQL, f, resp.Status, jsonbArg(jsonBody), rawBody, jsonbArg(headers))
	}
	err = exec()
	if rawBody == nil && jsonBody != nil && err != nil && pgReason(err) == ReasonData {
		// Postgres refused a value (ReasonData): the body is JSON it will
		// not store as JSONB (\u0000, a character the database encoding
		// lacks, a number beyond numeric's range, a value past JSONB's
		// limits). The update changed nothing, so store the bytes raw.
		jsonBody, rawBody = jsonStoredRaw, jsonBody
		err = exec()
	}
	return pgOwnerError("complete", err)
}

// completeIn records resp inside q (a transactional route's transaction),
// fenced on f. A failed statement aborts the transaction, so there is no
// second try: every JSON body JSONB might refuse (jsonbMayRefuse) is stored
// raw up front (it still reads back as the same BodyJSON bytes).
func (s *PostgresStore) completeIn(ctx context.Context, q execer, f Fence, resp Response) error {
	jsonBody, rawBody, headers, err := completeArgs(resp, true)
	if err != nil {
		return err
	}
	return pgOwnerError("complete", fenced(ctx, q, pgCompleteSQL, f, resp.Status, jsonbArg(jsonBody), rawBody, jsonbArg(headers)))
}

// completeArgs encodes resp for pgCompleteSQL. A BodyJSON body JSONB cannot
// hold (a \u0000 escape; with cautious, anything jsonbMayRefuse flags) goes
// byte for byte to the raw column with the jsonStoredRaw marker in the
// JSONB column.
func completeArgs(resp Response, cautious bool) (jsonBody, rawBody, headers []byte, err error) {
	headers, err = encodeHeaders(resp.Header)
	if err != nil {
		return nil, nil, nil, &StoreError{Op: "complete", Reason: ReasonOther, Err: err}
	}
	switch resp.BodyKind {
	case BodyJSON:
		refused := bytes.Contains(resp.Body, []byte(`\u0000`))
		if cautious {
			refused = jsonbMayRefuse(resp.Body)
		}
		if refused {
			jsonBody, rawBody = jsonStoredRaw, nonNil(resp.Body)
		} else {
			jsonBody = nonNil(resp.Body)
		}
	case BodyRaw:
		rawBody = nonNil(resp.Body) // nil would be stored as NULL: no body at all
	}
	return jsonBody, rawBody, headers, nil
}

// Fail implements Store with one fenced UPDATE.
func (s *PostgresStore) Fail(ctx context.Context, f Fence) error {
	return pgOwnerError("fail", fenced(ctx, s.pool, pgFailSQL, f))
}

// Release implements Store with one fenced DELETE.
func (s *PostgresStore) Release(ctx context.Context, f Fence) error {
	return pgOwnerError("release", fenced(ctx, s.pool, pgReleaseSQL, f))
}

// execer runs a statement: the pool, or a transactional route's transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// fenced runs a statement on q whose first three parameters are f (id,
// attempt, scope), returning ErrNotOwner when it changed no row.
func fenced(ctx context.Context, q execer, sql string, f Fence, args ...any) error {
	return retrySerialization(ctx, func() error {
		tag, err := q.Exec(ctx, sql, append([]any{f.ID, f.Attempt, f.Scope}, args...)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotOwner
		}
		return nil
	})
}

// DeleteExpired implements Store: it reads at most limit deletable rows,
// earliest expiry first, without locking them (pgExpiredBatchSQL), then
// deletes them with one DELETE per scope (pgDeleteExpiredSQL), all sent in
// one pipelined batch, which runs as one transaction. Each DELETE checks
// the predicate again, so a row taken over since the read stays. Two
// cleaners running at once may read the same rows: the second waits for
// the first's delete and then deletes none of them, so its batch may count
// fewer rows than it read (the next batch or run goes on).
func (s *PostgresStore) DeleteExpired(ctx context.Context, limit int) (int64, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := retrySerialization(ctx, func() (err error) {
		n, err = s.deleteExpired(ctx, limit)
		return err
	})
	if err != nil {
		return 0, pgStoreError("cleanup", err)
	}
	return n, nil
}

// deleteExpired runs one batch of DeleteExpired.
func (s *PostgresStore) deleteExpired(ctx context.Context, limit int) (int64, error) {
	rows, err := s.pool.Query(ctx, pgExpiredBatchSQL, int64(limit))
	if err != nil {
		return 0, err
	}
	byScope := make(map[string][]int64)
	var (
		scope string
		id    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &id}, func() error {
		byScope[scope] = append(byScope[scope], id)
		return nil
	})
	if err != nil || len(byScope) == 0 {
		return 0, err
	}
	// One order for every cleaner, so two of them lock rows in the same
	// order and do not deadlock.
	scopes := slices.Sorted(maps.Keys(byScope))
	batch := &pgx.Batch{}
	for _, sc := range scopes {
		ids := byScope[sc]
		slices.Sort(ids)
		batch.Queue(pgDeleteExpiredSQL, sc, ids)
	}
	results := s.pool.SendBatch(ctx, batch)
	var n int64
	for range scopes {
		tag, err := results.Exec()
		if err != nil {
			results.Close()
			return 0, err
		}
		n += tag.RowsAffected()
	}
	return n, results.Close()
}

// ReleaseOwner implements OwnerReleaser with one DELETE that names the
// key's scope (one shard on Citus). A lost connection is retried once, like
// a claim: the DELETE is idempotent.
func (s *PostgresStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	if req.Owner == uuid.Nil {
		return false, nil
	}
	var n int64
	err := retryConnLoss(ctx, func() error {
		tag, err := s.pool.Exec(ctx, pgReleaseOwnerSQL, req.Key, req.Scope, req.Endpoint, ownerArg(req.Owner))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, pgStoreError("release", err)
	}
	return n > 0, nil
}

// ownerArg passes an owner token as its text form, or NULL for none. The
// statements cast it ($n::uuid), so it works in every pgx query mode.
func ownerArg(o uuid.UUID) any {
	if o == uuid.Nil {
		return nil
	}
	return o.String()
}

// DeleteScope implements Store in one statement: the rows it deletes and
// the live in_flight rows it skips are read from one snapshot.
func (s *PostgresStore) DeleteScope(ctx context.Context, scope string) (ErasureResult, error) {
	var res ErasureResult
	// REPEATABLE READ: a row that changed after the statement's snapshot
	// (a takeover or reclaim committing while the DELETE waited for its
	// lock) fails the statement with a serialization error instead of
	// being skipped by the DELETE's re-check while the snapshot read still
	// sees it as deletable: every row is then deleted or reported, never
	// neither. The retry takes a new snapshot.
	err := retrySerialization(ctx, func() error {
		res = ErasureResult{}
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, pgDeleteScopeSQL, scope)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					deleted int64
					rec     nullRecord
				)
				if err := rows.Scan(append([]any{&deleted}, rec.dest()...)...); err != nil {
					return err
				}
				res.Deleted = deleted
				if r, ok, err := rec.record(); err != nil {
					return err
				} else if ok {
					res.Skipped = append(res.Skipped, r)
				}
			}
			return rows.Err()
		})
	})
	if err != nil {
		return ErasureResult{}, pgStoreError("erase", err)
	}
	return res, nil
}

// ExportScope implements Store with one SELECT.
func (s *PostgresStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	var recs []Record
	err := retryConnLoss(ctx, func() error {
		recs = nil
		rows, err := s.pool.Query(ctx, pgExportScopeSQL, scope)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rec Record
			if err := scanRecord(rows, &rec, nil); err != nil {
				return err
			}
			recs = append(recs, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, pgStoreError("export", err)
	}
	return recs, nil
}

// scanRecord reads pgColumns (and, when won is not nil, a trailing won
// column) into rec.
func scanRecord(row pgx.Row, rec *Record, won *bool) error {
	var v rowValues
	dest := []any{
		&rec.ID, &rec.Key, &rec.Scope, &rec.Endpoint, &rec.RequestHash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers,
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt,
		&rec.Expired, &rec.LeaseOver, &rec.Reclaimable,
	}
	if won != nil {
		dest = append(dest, won)
	}
	if err := row.Scan(dest...); err != nil {
		return err
	}
	return v.fill(rec)
}

// scanClaim reads pgClaimColumns and the won flag; the key, scope and
// endpoint are the claim's own.
func scanClaim(row pgx.Row, req ClaimRequest, rec *Record, won *bool) error {
	var v rowValues
	if err := row.Scan(&rec.ID, &rec.RequestHash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers,
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt,
		&rec.Expired, &rec.LeaseOver, &rec.Reclaimable, won); err != nil {
		return err
	}
	rec.Key, rec.Scope, rec.Endpoint = req.Key, req.Scope, req.Endpoint
	return v.fill(rec)
}

// rowValues are the columns decoded after the scan.
type rowValues struct {
	status             string
	code               *int16
	body, raw, headers []byte
}

func (v *rowValues) fill(rec *Record) error {
	rec.Status = Status(v.status)
	resp, err := decodeResponse(v.code, v.body, v.raw, v.headers)
	if err != nil {
		return err
	}
	rec.Response = resp
	return nil
}

// nullRecord receives pgColumns from an outer join, where all of them may
// be NULL.
type nullRecord struct {
	id                                 *int64
	key, scope, endpoint, hash, status *string
	attempt                            *int32
	code                               *int16
	body, raw, headers                 []byte
	createdAt, lockedAt, lockedUntil   *time.Time
	expiresAt                          *time.Time
	expired, leaseOver, reclaimable    *bool
}

// dest returns the scan destinations in pgColumns order.
func (n *nullRecord) dest() []any {
	return []any{
		&n.id, &n.key, &n.scope, &n.endpoint, &n.hash, &n.status, &n.attempt,
		&n.code, &n.body, &n.raw, &n.headers,
		&n.createdAt, &n.lockedAt, &n.lockedUntil, &n.expiresAt,
		&n.expired, &n.leaseOver, &n.reclaimable,
	}
}

// record returns the row read, or ok false when the join found none.
func (n *nullRecord) record() (rec Record, ok bool, err error) {
	if n.id == nil {
		return Record{}, false, nil
	}
	resp, err := decodeResponse(n.code, n.body, n.raw, n.headers)
	if err != nil {
		return Record{}, false, err
	}
	return Record{
		ID: *n.id, Key: *n.key, Scope: *n.scope, Endpoint: *n.endpoint,
		RequestHash: *n.hash, Status: Status(*n.status), Attempt: *n.attempt,
		Response:  resp,
		CreatedAt: *n.createdAt, LockedAt: *n.lockedAt, LockedUntil: *n.lockedUntil, ExpiresAt: *n.expiresAt,
		Expired: *n.expired, LeaseOver: *n.leaseOver, Reclaimable: *n.reclaimable,
	}, true, nil
}

// jsonStoredRaw is what the JSONB column holds when a JSON body is kept in
// the raw column because JSONB cannot hold it: any non-NULL value would do,
// as both columns set means "a JSON body, stored raw".
var jsonStoredRaw = []byte(`null`)

// decodeResponse rebuilds a recorded response from its columns: a JSONB
// body is BodyJSON; both a JSONB and a raw body are a BodyJSON kept raw
// (see Complete); a raw body alone is BodyRaw; neither is BodyNone. The
// CLI's inspect decodes the body columns with the same storedbody.Decode.
func decodeResponse(code *int16, body, raw, headers []byte) (Response, error) {
	var resp Response
	if code != nil {
		resp.Status = int(*code)
	}
	var kind storedbody.Kind
	resp.Body, kind = storedbody.Decode(body, raw)
	switch kind {
	case storedbody.JSON:
		resp.BodyKind = BodyJSON
	case storedbody.Raw:
		resp.BodyKind = BodyRaw
	}
	if headers != nil {
		if err := json.Unmarshal(headers, &resp.Header); err != nil {
			return Response{}, errors.New("idempotency: stored response_headers are not an object of string arrays: " + err.Error())
		}
	}
	return resp, nil
}

// encodeHeaders returns h as a JSONB object of string arrays, or nil (NULL)
// when h is nil. Values holding a NUL byte are left out: HTTP forbids them
// (RFC 9110, section 5.5) and JSONB cannot store them.
func encodeHeaders(h http.Header) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	return json.Marshal(withoutNUL(h))
}

// withoutNUL returns h, or a copy of h without the values that hold a NUL
// byte when there are any.
func withoutNUL(h http.Header) http.Header {
	hasNUL := false
	for _, vs := range h {
		for _, v := range vs {
			hasNUL = hasNUL || strings.IndexByte(v, 0) >= 0
		}
	}
	if !hasNUL {
		return h
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		for _, v := range vs {
			if strings.IndexByte(v, 0) < 0 {
				out[k] = append(out[k], v)
			}
		}
	}
	return out
}

// nonNil returns b, or an empty non-nil slice when b is nil, so that pgx
// sends an empty value rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// maxJSONBNumber is the longest number literal a cautious record stores as
// JSONB; numeric holds far more digits, but no response needs them.
const maxJSONBNumber = 100

// jsonbMayRefuse reports whether Postgres might refuse body (valid JSON) as
// JSONB: any \u escape (\u0000 is refused, others may lack a character in
// the database encoding), or a number with an exponent or longer than
// maxJSONBNumber (JSONB numbers are numeric, whose range is bounded:
// 1e400000 is refused). It errs towards true: a body stored raw replays
// byte for byte all the same.
func jsonbMayRefuse(body []byte) bool {
	inString, escaped, numLen := false, false, 0
	for _, c := range body {
		if inString {
			switch {
			case escaped:
				if c == 'u' {
					return true
				}
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch {
		case c == '"':
			inString, numLen = true, 0
		case c == '-' || c == '.' || c == '+' || c >= '0' && c <= '9':
			numLen++
			if numLen > maxJSONBNumber {
				return true
			}
		case c == 'e' || c == 'E':
			if numLen > 0 { // inside a number: an exponent (true and false start with a letter)
				return true
			}
		default:
			numLen = 0
		}
	}
	return false
}

// retrySerialization runs f again, a bounded number of times, while it fails
// with a serialization failure or a deadlock (possible when the host runs
// its sessions at SERIALIZABLE or REPEATABLE READ); the failed statement
// changed nothing.
func retrySerialization(ctx context.Context, f func() error) error {
	var err error
	for range pgRetries {
		if err = f(); !isRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// isRetryable reports a serialization failure or a deadlock.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// pgOwnerError translates err like pgStoreError but keeps ErrNotOwner as it
// is.
func pgOwnerError(op string, err error) error {
	if err == nil || errors.Is(err, ErrNotOwner) {
		return err
	}
	return pgStoreError(op, err)
}

// pgStoreError wraps a pgx error in a *StoreError for op.
func pgStoreError(op string, err error) error {
	return &StoreError{Op: op, Reason: pgReason(err), Err: explainPooler(err)}
}

// pgReason classifies a pgx error as one of the Reason constants.
func pgReason(err error) string {
	var (
		pgErr      *pgconn.PgError
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	// The context first: pgx reports an interrupted call as whatever it
	// was doing (connecting, reading), wrapping the context's error.
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), pgconn.Timeout(err):
		return ReasonTimeout
	case err.Error() == "closed pool" || strings.HasSuffix(err.Error(), ": closed pool"):
		// pgxpool returns puddle's ErrClosedPool, a plain error, unwrapped.
		return ReasonClosed
	case errors.As(err, &connectErr):
		return ReasonConnection
	case errors.As(err, &pgErr):
		return pgCodeReason(pgErr.Code)
	case errors.As(err, &netErr):
		if netErr.Timeout() {
			return ReasonTimeout
		}
		return ReasonConnection
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed):
		return ReasonConnection
	}
	return ReasonOther
}

// pgCodeReason classifies a SQLSTATE.
func pgCodeReason(code string) string {
	switch code {
	case "42P01", // undefined_table
		"42703", // undefined_column
		"42P10", // invalid_column_reference: the unique constraint ON CONFLICT needs is missing
		"3F000": // invalid_schema_name
		return ReasonSchema
	case "42501": // insufficient_privilege
		return ReasonPermission
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return ReasonConflict
	case "57014", // query_canceled: statement_timeout, or a cancel request
		"55P03": // lock_not_available: lock_timeout
		return ReasonTimeout
	case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
		"53300": // too_many_connections
		return ReasonConnection
	}
	switch {
	case strings.HasPrefix(code, "08"): // connection_exception
		return ReasonConnection
	case strings.HasPrefix(code, "22"), // data_exception: a value the column cannot hold
		strings.HasPrefix(code, "54"): // program_limit_exceeded: e.g. an index row too large
		return ReasonData
	}
	return ReasonOther
}
