package idempotency

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

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
	pgtype.BoolOID, pgtype.BoolOID, pgtype.BoolOID,
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
	for i, b := range []*bool{&rec.Expired, &rec.LeaseOver, won} {
		if *b, ok = boolValue(values[13+i]); !ok {
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
