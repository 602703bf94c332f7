package idempotency

import (
	"encoding/hex"
	"errors"
	"time"

	"github.com/idemkit/idempotency/internal/storedbody"
	"github.com/jackc/pgx/v5"
)

// How PostgresStore encodes a Record into its columns and decodes it back.

// completeArgs encodes resp for pgsql.CompleteSQL: the body's bytes in the
// column of its kind (response_body for BodyJSON, response_body_raw for
// BodyRaw; both BYTEA, so every body is stored as it is), and the headers'
// JSON.
func completeArgs(resp Response) (jsonBody, rawBody, headers []byte, err error) {
	if resp.SealKeyID != "" {
		// The envelope holds the body and the headers: nothing else of
		// them reaches the table.
		return nil, nonNil(resp.Body), nil, nil
	}
	headers, err = storedbody.EncodeHeaders(resp.Header)
	if err != nil {
		return nil, nil, nil, &StoreError{Op: "complete", Reason: ReasonOther, Err: err}
	}
	switch resp.BodyKind {
	case BodyJSON:
		jsonBody = nonNil(resp.Body)
	case BodyRaw:
		rawBody = nonNil(resp.Body) // nil would be stored as NULL: no body at all
	}
	return jsonBody, rawBody, headers, nil
}

// scanRecord reads pgsql.Columns into rec, and any trailing columns into
// extra.
func scanRecord(row pgx.Row, rec *Record, extra ...any) error {
	var v rowValues
	dest := []any{
		&rec.ID, &rec.Key, &rec.Scope, &rec.Endpoint, &v.hash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers, &v.sealKeyID,
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt,
		&rec.Expired, &rec.LeaseOver,
	}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return err
	}
	rec.RequestHash = hex.EncodeToString(v.hash)
	return v.fill(rec)
}

// scanClaim reads pgsql.ClaimColumns and the won flag; the key, scope and
// endpoint are the claim's own.
func scanClaim(row pgx.Row, req ClaimRequest, rec *Record, won *bool) error {
	var v rowValues
	if err := row.Scan(&rec.ID, &v.hash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers, &v.sealKeyID,
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt,
		&rec.Expired, &rec.LeaseOver, won); err != nil {
		return err
	}
	rec.Key, rec.Scope, rec.Endpoint = req.Key, req.Scope, req.Endpoint
	rec.RequestHash = hex.EncodeToString(v.hash)
	return v.fill(rec)
}

// rowValues are the columns decoded after the scan.
type rowValues struct {
	hash               []byte // request_hash, by the pgx scans
	status             string
	code               *int16
	body, raw, headers []byte
	sealKeyID          *string
}

func (v *rowValues) fill(rec *Record) error {
	rec.Status = Status(v.status)
	resp, err := decodeResponse(v.code, v.body, v.raw, v.headers, v.sealKeyID)
	if err != nil {
		return err
	}
	rec.Response = resp
	return nil
}

// nullRecord receives pgsql.Columns from an outer join, where all of them may
// be NULL.
type nullRecord struct {
	id                               *int64
	key, scope, endpoint, status     *string
	hash                             []byte
	attempt                          *int32
	code                             *int16
	body, raw, headers               []byte
	sealKeyID                        *string
	createdAt, lockedAt, lockedUntil *time.Time
	expiresAt                        *time.Time
	expired, leaseOver               *bool
}

// dest returns the scan destinations in pgsql.Columns order.
func (n *nullRecord) dest() []any {
	return []any{
		&n.id, &n.key, &n.scope, &n.endpoint, &n.hash, &n.status, &n.attempt,
		&n.code, &n.body, &n.raw, &n.headers, &n.sealKeyID,
		&n.createdAt, &n.lockedAt, &n.lockedUntil, &n.expiresAt,
		&n.expired, &n.leaseOver,
	}
}

// record returns the row read, or ok false when the join found none.
func (n *nullRecord) record() (rec Record, ok bool, err error) {
	if n.id == nil {
		return Record{}, false, nil
	}
	resp, err := decodeResponse(n.code, n.body, n.raw, n.headers, n.sealKeyID)
	if err != nil {
		return Record{}, false, err
	}
	return Record{
		ID: *n.id, Key: *n.key, Scope: *n.scope, Endpoint: *n.endpoint,
		RequestHash: hex.EncodeToString(n.hash), Status: Status(*n.status), Attempt: *n.attempt,
		Response:  resp,
		CreatedAt: *n.createdAt, LockedAt: *n.lockedAt, LockedUntil: *n.lockedUntil, ExpiresAt: *n.expiresAt,
		Expired: *n.expired, LeaseOver: *n.leaseOver,
	}, true, nil
}

// decodeResponse rebuilds a recorded response from its columns: a
// response_body is BodyJSON; a raw body alone is BodyRaw; neither is
// BodyNone (storedbody.Decode). A
// row with a seal key id holds a sealed response: its raw column, as
// BodyRaw, with the id. The CLI reads the same decoding through
// PostgresStore.Lookup and ExportScope.
func decodeResponse(code *int16, body, raw, headers []byte, sealKeyID *string) (Response, error) {
	var resp Response
	if code != nil {
		resp.Status = int(*code)
	}
	if sealKeyID != nil {
		resp.Body, resp.BodyKind, resp.SealKeyID = raw, BodyRaw, *sealKeyID
		return resp, nil
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
		h, err := storedbody.DecodeHeaders(headers)
		if err != nil {
			return Response{}, errors.New("idempotency: stored response_headers are not an object of string arrays: " + err.Error())
		}
		resp.Header = h
	}
	return resp, nil
}

// nonNil returns b, or an empty non-nil slice when b is nil, so that pgx
// sends an empty value rather than NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
