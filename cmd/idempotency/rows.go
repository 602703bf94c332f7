package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/seal"
	"github.com/idemkit/idempotency/internal/storedbody"
)

// What the CLI reads and changes in the table beyond idempotency.Store:
// one key's rows, the release of one stuck key, and the table's counts.
// Plain SQL on either dialect (see dialectSQL), against the database's
// clock, so no store needs a door for the CLI alone.

// lookupSQL reads one key's rows in one scope, by endpoint, with the
// database's clock last; {hash} is the request hash as hex.
//
// $1 key, $2 scope, then the endpoint when there is one.
const lookupSQL = `SELECT id, idem_key, scope_user_id, scope_endpoint, {hash}, status, attempt,
	response_code, response_body, response_body_raw, response_headers, seal_key_id,
	created_at, locked_at, locked_until, expires_at, derive_key_id, {now}
FROM idempotency_keys WHERE idem_key = $1 AND scope_user_id = $2`

// releaseKeySQL deletes a row an operator releases, fenced on the attempt
// it was read with, only while it is failed or in flight past its lease.
//
// $1 scope, $2 key, $3 endpoint, $4 id, $5 attempt.
const releaseKeySQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $1 AND idem_key = $2 AND scope_endpoint = $3 AND id = $4 AND attempt = $5
	AND (status = 'failed' OR (status = 'in_flight' AND locked_until < {now}))`

// cleanupWhere is what Store.Cleanup deletes: past retain_until (expires_at, or
// its grace after it for a tombstone), and not in flight
// inside its lease.
const cleanupWhere = `retain_until < {now} AND expires_at < {now} AND NOT (status = 'in_flight' AND locked_until >= {now})`

// statsSQL counts the table in one scan, with the database's clock last.
const statsSQL = `SELECT COUNT(*),
	COALESCE(SUM(CASE WHEN status = 'in_flight' THEN 1 ELSE 0 END), 0),
	COALESCE(SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END), 0),
	COALESCE(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0),
	MIN(CASE WHEN status = 'in_flight' THEN locked_at END),
	COALESCE(SUM(CASE WHEN status = 'in_flight' AND locked_until < {now} THEN 1 ELSE 0 END), 0),
	COALESCE(SUM(CASE WHEN ` + cleanupWhere + ` THEN 1 ELSE 0 END), 0),
	MIN(CASE WHEN ` + cleanupWhere + ` THEN expires_at END),
	{now}
FROM idempotency_keys`

// tableStats counts the rows of the table in one read; ages are measured
// against the database's clock.
type tableStats struct {
	Total, InFlight, Completed, Failed int64
	// OldestInFlightAge is how long ago the oldest in_flight row was
	// claimed (its locked_at); 0 when InFlight is 0.
	OldestInFlightAge time.Duration
	// InFlightPastLease counts in_flight rows whose lease is over (stale:
	// the outcome is unknown).
	InFlightPastLease int64
	// AwaitingCleanup counts the rows Cleanup would delete now.
	AwaitingCleanup int64
	// OldestExpiredAge is how long the oldest of them has been expired; 0
	// when AwaitingCleanup is 0.
	OldestExpiredAge time.Duration
}

// lookup reads the rows of key in scope, on every endpoint or on endpoint
// alone when it is not "", ordered by endpoint, with Expired and LeaseOver
// by the database's clock, and that clock's time. With keys (not nil) it
// opens the sealed rows it can and leaves the others sealed.
func (d *database) lookup(ctx context.Context, keys *seal.Keyring, key, scope, endpoint string) ([]idempotency.Record, time.Time, error) {
	q, args := lookupSQL, []any{key, scope}
	if endpoint != "" {
		q, args = q+" AND scope_endpoint = $3", append(args, endpoint)
	}
	hash := "encode(request_hash, 'hex')"
	if d.sqlDB != nil {
		hash = "request_hash"
	}
	var (
		recs []idempotency.Record
		now  time.Time
		rec  idempotency.Record
		v    storedRow
	)
	dest := []any{&rec.ID, &rec.Key, &rec.Scope, &rec.Endpoint, &rec.RequestHash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers, &v.keyID, &rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt, &rec.DeriveKeyID, &now}
	err := d.query(ctx, strings.ReplaceAll(q, "{hash}", hash)+" ORDER BY scope_endpoint", args, dest, func() error {
		r := rec
		r.Status = idempotency.Status(v.status)
		r.Expired, r.LeaseOver = r.ExpiresAt.Before(now), r.LockedUntil.Before(now)
		var err error
		if r.Response, err = v.response(ctx, keys, r); err != nil {
			return err
		}
		recs = append(recs, r)
		v = storedRow{} // the next scan must not write through what r kept
		return nil
	})
	if err != nil || len(recs) > 0 {
		return recs, now, err
	}
	err = d.query(ctx, `SELECT {now}`, nil, []any{&now}, func() error { return nil })
	return nil, now, err
}

// storedRow is a row's response columns as stored.
type storedRow struct {
	status             string
	code               *int16
	body, raw, headers []byte
	keyID              *string
}

// response decodes the stored response of rec: opened with keys when it
// is sealed and they open it, else left sealed (SealKeyID set, the sealed
// value as a raw body), as the stores read it.
func (v *storedRow) response(ctx context.Context, keys *seal.Keyring, rec idempotency.Record) (idempotency.Response, error) {
	var resp idempotency.Response
	if v.code != nil {
		resp.Status = int(*v.code)
	}
	if v.keyID != nil {
		resp.Body, resp.BodyKind, resp.SealKeyID = v.raw, idempotency.BodyRaw, *v.keyID
		if keys == nil {
			return resp, nil
		}
		row := seal.Row{ID: rec.ID, Attempt: rec.Attempt, Scope: rec.Scope, Endpoint: rec.Endpoint,
			Key: rec.Key, RequestHash: rec.RequestHash, Status: resp.Status}
		p, err := seal.New(keys).Open(ctx, row, *v.keyID, v.raw)
		if err != nil {
			return resp, nil
		}
		return idempotency.Response{Status: resp.Status, Header: p.Header, Body: p.Body, BodyKind: idempotency.BodyKind(p.Kind)}, nil
	}
	var kind storedbody.Kind
	resp.Body, kind = storedbody.Decode(v.body, v.raw)
	switch kind {
	case storedbody.JSON:
		resp.BodyKind = idempotency.BodyJSON
	case storedbody.Raw:
		resp.BodyKind = idempotency.BodyRaw
	}
	if v.headers != nil {
		h, err := storedbody.DecodeHeaders(v.headers)
		if err != nil {
			return idempotency.Response{}, errors.New("stored response_headers are not an object of string arrays: " + err.Error())
		}
		resp.Header = h
	}
	return resp, nil
}

// releaseKey deletes the row f names, only while it still has f's attempt
// and is failed or in flight past its lease by the database's clock, and
// reports whether it did.
func (d *database) releaseKey(ctx context.Context, f idempotency.Fence) (bool, error) {
	q, args := d.dialectSQL(releaseKeySQL), []any{f.Scope, f.Key, f.Endpoint, f.ID, f.Attempt}
	if d.pool != nil {
		tag, err := d.pool.Exec(ctx, q, args...)
		return tag.RowsAffected() > 0, err
	}
	r, err := d.sqlDB.ExecContext(ctx, q, args...)
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

// stats counts the table in one read.
func (d *database) stats(ctx context.Context) (tableStats, error) {
	var (
		st                  tableStats
		oldestIn, oldestExp *time.Time
		now                 time.Time
	)
	err := d.query(ctx, statsSQL, nil, []any{&st.Total, &st.InFlight, &st.Completed, &st.Failed, &oldestIn,
		&st.InFlightPastLease, &st.AwaitingCleanup, &oldestExp, &now}, func() error { return nil })
	if oldestIn != nil {
		st.OldestInFlightAge = now.Sub(*oldestIn)
	}
	if oldestExp != nil {
		st.OldestExpiredAge = now.Sub(*oldestExp)
	}
	return st, err
}

// countCleanup counts the rows Store.Cleanup would delete now; it deletes
// nothing.
func (d *database) countCleanup(ctx context.Context) (int64, error) {
	var n int64
	err := d.query(ctx, `SELECT COUNT(*) FROM idempotency_keys WHERE `+cleanupWhere, nil, []any{&n}, func() error { return nil })
	return n, err
}
