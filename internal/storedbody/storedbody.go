// Package storedbody decodes a recorded response body from the two columns
// the Postgres store keeps it in (replays, export, and the CLI's inspect
// through PostgresStore.Lookup).
package storedbody

// Kind says how a decoded body is to be read. Its values match the root
// package's BodyKind.
type Kind uint8

// The kinds of a stored body.
const (
	None Kind = iota // no body recorded
	JSON             // a JSON document
	Raw              // any other bytes, replayed as they are
)

// Decode returns the body recorded in response_body (JSONB, as text) and
// response_body_raw, and its kind. A JSONB body alone is JSON. Both columns
// set mean a JSON body that JSONB refused (a \u0000 escape, a number beyond
// numeric's range), kept byte for byte in the raw column with a marker in
// the JSONB column: JSON, from the raw column. A raw body alone is Raw
// (empty included); neither is None.
func Decode(jsonCol, rawCol []byte) ([]byte, Kind) {
	switch {
	case jsonCol != nil && rawCol != nil:
		return rawCol, JSON
	case jsonCol != nil:
		return jsonCol, JSON
	case rawCol != nil:
		return rawCol, Raw
	}
	return nil, None
}
