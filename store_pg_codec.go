package idempotency

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"time"

	"github.com/idemkit/idempotency/internal/storedbody"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The codec: a call's values in as arguments, the rows out as a Record,
// decoded without reflection on the claim's hot path.

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
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt, &rec.DeriveKeyID,
		&rec.Expired, &rec.LeaseOver, &rec.Tombstone,
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
	if err := row.Scan(v.claimDest(rec, won)...); err != nil {
		return err
	}
	rec.Key, rec.Scope, rec.Endpoint = req.Key, req.Scope, req.Endpoint
	rec.RequestHash = hex.EncodeToString(v.hash)
	return v.fill(rec)
}

// claimScanner reads a batch's rows (pgsql.ClaimBatchSQL): the key, scope
// and endpoint, then what scanClaim reads. Its scan targets are made once
// a batch, not once a row.
type claimScanner struct {
	v    rowValues
	rec  Record
	won  bool
	dest []any
}

func (sc *claimScanner) scan(row pgx.Row, rec *Record, won *bool) error {
	if sc.dest == nil {
		sc.dest = append([]any{&sc.rec.Key, &sc.rec.Scope, &sc.rec.Endpoint}, sc.v.claimDest(&sc.rec, &sc.won)...)
	}
	sc.v, sc.rec, sc.won = rowValues{}, Record{}, false // nothing of the last row's is scanned into again
	if err := row.Scan(sc.dest...); err != nil {
		return err
	}
	sc.rec.RequestHash = hex.EncodeToString(sc.v.hash)
	if err := sc.v.fill(&sc.rec); err != nil {
		return err
	}
	*rec, *won = sc.rec, sc.won
	return nil
}

// claimDest are the scan targets of pgsql.ClaimColumns and the won flag.
func (v *rowValues) claimDest(rec *Record, won *bool) []any {
	return []any{&rec.ID, &v.hash, &v.status, &rec.Attempt,
		&v.code, &v.body, &v.raw, &v.headers, &v.sealKeyID,
		&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt, &rec.DeriveKeyID,
		&rec.Expired, &rec.LeaseOver, &rec.Tombstone, won}
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
	deriveKeyID                      *string
	expired, leaseOver, tombstone    *bool
}

// dest returns the scan destinations in pgsql.Columns order.
func (n *nullRecord) dest() []any {
	return []any{
		&n.id, &n.key, &n.scope, &n.endpoint, &n.hash, &n.status, &n.attempt,
		&n.code, &n.body, &n.raw, &n.headers, &n.sealKeyID,
		&n.createdAt, &n.lockedAt, &n.lockedUntil, &n.expiresAt, &n.deriveKeyID,
		&n.expired, &n.leaseOver, &n.tombstone,
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
		DeriveKeyID: *n.deriveKeyID, Expired: *n.expired, LeaseOver: *n.leaseOver, Tombstone: *n.tombstone,
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

// How PostgresStore reads a claim's row without pgx's per-query scan
// planning: pgx plans the scan of every column again for every query (15
// plans, about as many allocations, for each claim), while the claim's
// columns are always the same built-in types in binary. decodeClaimRow
// decodes them itself, exactly as pgx's own codecs would, and declines
// (pgx then scans as usual) for anything it does not expect: another type
// or format, a NULL where pgx would refuse it, a value pgx would refuse, or
// a connection whose type map replaces one of the types' codecs.

// claimColumnOIDs are the types of pgsql.ClaimColumns and the won flag, in
// order.
var claimColumnOIDs = [...]uint32{
	pgtype.Int8OID, pgtype.ByteaOID, pgtype.TextOID, pgtype.Int4OID,
	pgtype.Int2OID, pgtype.ByteaOID, pgtype.ByteaOID, pgtype.ByteaOID, pgtype.TextOID,
	pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID,
	pgtype.TextOID, pgtype.BoolOID, pgtype.BoolOID, pgtype.BoolOID, pgtype.BoolOID,
}

// defaultTypes are pgx's built-in types of claimColumnOIDs, each once: a
// connection that registered another type for one of them is scanned by
// pgx.
var defaultTypes = func() (types []oidType) {
	m := pgtype.NewMap()
	for _, oid := range claimColumnOIDs {
		if !slices.ContainsFunc(types, func(t oidType) bool { return t.oid == oid }) {
			t, _ := m.TypeForOID(oid)
			types = append(types, oidType{oid, t})
		}
	}
	return types
}()

type oidType struct {
	oid uint32
	t   *pgtype.Type
}

// scanClaimRows reads the claim's one row from rows as scanClaim would
// from pgx.Conn.QueryRow: pgx.ErrNoRows for none, else the row, and the
// error the rest of the result may carry. It closes rows.
func scanClaimRows(rows pgx.Rows, req ClaimRequest, rec *Record, won *bool) error {
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	var v rowValues
	if !decodeClaimRow(rows, rec, &v, won) {
		*rec, *won = Record{}, false
		return scanClaim(lastRow{rows}, req, rec, won)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rec.Key, rec.Scope, rec.Endpoint = req.Key, req.Scope, req.Endpoint
	return v.fill(rec)
}

// lastRow scans the current row of rows for scanClaim, then closes them,
// as pgx's QueryRow does: the error is the result's, whatever the scan's.
type lastRow struct{ rows pgx.Rows }

func (r lastRow) Scan(dest ...any) error {
	_ = r.rows.Scan(dest...) // pgx closes the rows with its error
	r.rows.Close()
	return r.rows.Err()
}

// decodeClaimRow decodes the current row of rows into rec, v and won as
// scanClaim's pgx scan would, or reports false, having set nothing that
// matters, when pgx must scan it.
func decodeClaimRow(rows pgx.Rows, rec *Record, v *rowValues, won *bool) bool {
	fields, values := rows.FieldDescriptions(), rows.RawValues()
	if len(fields) != len(claimColumnOIDs) || len(values) != len(claimColumnOIDs) {
		return false
	}
	for i, f := range fields {
		// pgx asks for text as text, for the rest binary; text reads
		// alike either way.
		if f.DataTypeOID != claimColumnOIDs[i] ||
			f.Format != pgtype.BinaryFormatCode && f.DataTypeOID != pgtype.TextOID {
			return false
		}
	}
	if conn := rows.Conn(); conn == nil || !defaultCodecs(conn.TypeMap()) {
		return false
	}
	var ok bool
	if rec.ID, ok = int8Value(values[0]); !ok {
		return false
	}
	if values[1] == nil || values[2] == nil {
		return false
	}
	rec.RequestHash, v.status = hex.EncodeToString(values[1]), string(values[2])
	if rec.Attempt, ok = int4Value(values[3]); !ok {
		return false
	}
	if values[4] != nil {
		code, ok := int2Value(values[4])
		if !ok {
			return false
		}
		v.code = &code
	}
	// The body, raw body and headers: bytea, in binary its bytes.
	v.body, v.raw, v.headers = bytes.Clone(values[5]), bytes.Clone(values[6]), bytes.Clone(values[7])
	if values[8] != nil {
		id := string(values[8])
		v.sealKeyID = &id
	}
	for i, t := range []*time.Time{&rec.CreatedAt, &rec.LockedAt, &rec.LockedUntil, &rec.ExpiresAt} {
		if *t, ok = timestamptzValue(values[9+i]); !ok {
			return false
		}
	}
	if values[13] == nil {
		return false
	}
	rec.DeriveKeyID = string(values[13])
	for i, b := range []*bool{&rec.Expired, &rec.LeaseOver, &rec.Tombstone, won} {
		if *b, ok = boolValue(values[14+i]); !ok {
			return false
		}
	}
	return true
}

// defaultCodecs reports whether m decodes claimColumnOIDs with pgx's
// built-in types (a registered type, such as a timestamptz codec with a
// ScanLocation, may decode differently).
func defaultCodecs(m *pgtype.Map) bool {
	for _, d := range defaultTypes {
		if t, _ := m.TypeForOID(d.oid); t != d.t {
			return false
		}
	}
	return true
}

// The binary decoders, as pgx's codecs decode into the scan's targets.

func int8Value(src []byte) (int64, bool) {
	if len(src) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(src)), true
}

func int4Value(src []byte) (int32, bool) {
	if len(src) != 4 {
		return 0, false
	}
	return int32(binary.BigEndian.Uint32(src)), true
}

func int2Value(src []byte) (int16, bool) {
	if len(src) != 2 {
		return 0, false
	}
	return int16(binary.BigEndian.Uint16(src)), true
}

func boolValue(src []byte) (bool, bool) {
	if len(src) != 1 {
		return false, false
	}
	return src[0] == 1, true
}

// microsecFromUnixEpochToY2K is 2000-01-01, binary timestamptz's zero, in
// microseconds since the Unix epoch.
const microsecFromUnixEpochToY2K = 946684800 * 1_000_000

// timestamptzValue decodes a binary timestamptz as pgx does (time.Unix, in
// the local zone) when it is a finite time between the years 1 and 9999,
// well inside the range pgx accepts; anything else is left to pgx.
func timestamptzValue(src []byte) (time.Time, bool) {
	if len(src) != 8 {
		return time.Time{}, false
	}
	microsecSinceY2K := int64(binary.BigEndian.Uint64(src))
	const bound = 8000 * 366 * 24 * 3600 * 1_000_000 // 8000 years: far from infinity's encodings and pgx's limits
	if microsecSinceY2K < -1999*366*24*3600*1_000_000 || microsecSinceY2K > bound {
		return time.Time{}, false
	}
	return time.UnixMicro(microsecFromUnixEpochToY2K + microsecSinceY2K), true
}
