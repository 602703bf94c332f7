package sqlstore

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/storedbody"
)

// How the store encodes a response into its columns and decodes a row
// back: the same columns as the pgx store (a JSON body in response_body,
// any other in response_body_raw, a sealed one raw with seal_key_id).

// dbTime scans a time column: a time.Time (go-sql-driver with
// parseTime=true, the PostgreSQL drivers) or its text (go-sql-driver
// without parseTime), always as UTC.
type dbTime struct{ t *time.Time }

func (d dbTime) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		*d.t = v.UTC()
		return nil
	case []byte:
		return d.parse(string(v))
	case string:
		return d.parse(v)
	}
	return fmt.Errorf("sqlstore: cannot scan %T into a time", src)
}

func (d dbTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return err
	}
	*d.t = t
	return nil
}

// rowValues are a row's columns as scanned.
type rowValues struct {
	code                 sql.NullInt64
	body, raw, headers   []byte
	sealKeyID            sql.NullString
	expired, leaseOver   bool
	created, locked      time.Time
	lockedUntil, expires time.Time
}

// scanRecord reads the MySQL statements' COLS_ and won, and extra, into
// rec.
func scanRecord(row interface{ Scan(...any) error }, rec *idempotency.Record, won *bool, extra ...any) error {
	w := new(bool)
	if won != nil {
		w = won
	}
	return scanRow(row, rec, []any{&rec.ID, &rec.Key, &rec.Scope, &rec.Endpoint}, append([]any{w}, extra...)...)
}

// scanColumns reads pgsql.Columns, and extra, into rec.
func scanColumns(row interface{ Scan(...any) error }, rec *idempotency.Record, extra ...any) error {
	return scanRow(row, rec, []any{&rec.ID, &rec.Key, &rec.Scope, &rec.Endpoint}, extra...)
}

// scanClaim reads pgsql.ClaimColumns and the won flag into rec; the key,
// scope and endpoint, which the claim knows, are req's.
func scanClaim(row interface{ Scan(...any) error }, req idempotency.ClaimRequest, rec *idempotency.Record, won *bool) error {
	rec.Key, rec.Scope, rec.Endpoint = req.Key, req.Scope, req.Endpoint
	return scanRow(row, rec, []any{&rec.ID}, won)
}

// scanRow reads head (the columns before request_hash), the stored
// columns from request_hash on, the two flags and tail into rec.
func scanRow(row interface{ Scan(...any) error }, rec *idempotency.Record, head []any, tail ...any) error {
	var v rowValues
	var status string
	var hash []byte
	dest := append(head, &hash, &status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers, &v.sealKeyID,
		dbTime{&v.created}, dbTime{&v.locked}, dbTime{&v.lockedUntil}, dbTime{&v.expires}, &rec.DeriveKeyID,
		&v.expired, &v.leaseOver)
	if err := row.Scan(append(dest, tail...)...); err != nil {
		return err
	}
	rec.RequestHash = hashText(hash)
	rec.Status = idempotency.Status(status)
	rec.CreatedAt, rec.LockedAt, rec.LockedUntil, rec.ExpiresAt = v.created, v.locked, v.lockedUntil, v.expires
	rec.Expired, rec.LeaseOver = v.expired, v.leaseOver
	resp, err := decodeResponse(v.code, v.body, v.raw, v.headers, v.sealKeyID)
	rec.Response = resp
	return err
}

// hashText is a stored request hash as the store compares it: MySQL keeps
// the 64 hex characters, PostgreSQL the 32 bytes (its column is bytea).
func hashText(b []byte) string {
	if len(b) == sha256.Size {
		return hex.EncodeToString(b)
	}
	return string(b)
}

// decodeResponse rebuilds a recorded response from its columns, as the
// pgx store does.
func decodeResponse(code sql.NullInt64, body, raw, headers []byte, sealKeyID sql.NullString) (idempotency.Response, error) {
	var resp idempotency.Response
	if code.Valid {
		resp.Status = int(code.Int64)
	}
	if sealKeyID.Valid {
		resp.Body, resp.BodyKind, resp.SealKeyID = nonNil(raw), idempotency.BodyRaw, sealKeyID.String
		return resp, nil
	}
	var kind storedbody.Kind
	resp.Body, kind = storedbody.Decode(body, raw)
	switch kind {
	case storedbody.JSON:
		resp.BodyKind = idempotency.BodyJSON
	case storedbody.Raw:
		resp.BodyKind = idempotency.BodyRaw
	}
	if headers != nil {
		h, err := storedbody.DecodeHeaders(headers)
		if err != nil {
			return idempotency.Response{}, errors.New("sqlstore: stored response_headers are not an object of string arrays: " + err.Error())
		}
		resp.Header = h
	}
	return resp, nil
}

// completeArgs encodes resp for the complete statement: JSON body, raw
// body, headers and seal key id. Every body and the headers are bytes, as
// both dialects store them (BYTEA; LONGBLOB from MySQL migration
// 000002_round4 on, with no JSON check to refuse a body the engine
// accepted). A nil []byte is NULL, so an empty body is sent as an empty,
// non-nil slice.
func completeArgs(resp idempotency.Response) (jsonBody, rawBody any, headers any, seal any, err error) {
	if resp.SealKeyID != "" {
		return nil, nonNil(resp.Body), nil, resp.SealKeyID, nil
	}
	if resp.Header != nil {
		b, err := storedbody.EncodeHeaders(resp.Header)
		if err != nil {
			return nil, nil, nil, nil, &idempotency.StoreError{Op: "complete", Reason: idempotency.ReasonOther, Err: err}
		}
		headers = b
	}
	switch resp.BodyKind {
	case idempotency.BodyJSON:
		jsonBody = nonNil(resp.Body)
	case idempotency.BodyRaw:
		rawBody = nonNil(resp.Body)
	}
	return jsonBody, rawBody, headers, nil, nil
}

// nonNil returns b, or an empty non-nil slice for nil.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// ownerArg is a claim's owner token as bound: NULL for none; on
// PostgreSQL its text form (the statements cast it to uuid), on MySQL its
// 16 bytes.
func (s *Store) ownerArg(req idempotency.ClaimRequest) any {
	owner := [16]byte(req.Owner)
	if owner == ([16]byte{}) {
		return nil
	}
	if s.d.name == PostgreSQL {
		return req.Owner.String()
	}
	return owner[:]
}
