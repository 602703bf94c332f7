// Package storedbody decodes a recorded response body from the two columns
// the stores keep it in (replays, export, and the CLI's inspect
// through PostgresStore.Lookup), and encodes and decodes the recorded
// headers' column; the pgx store and sqlstore share it.
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

// Decode returns the body recorded in response_body (a JSON body, the
// bytes the handler wrote) or response_body_raw (any other body, or a
// sealed envelope), and its kind: the first is JSON, the second Raw (empty
// included), neither None. The store writes at most one of the two.
func Decode(jsonCol, rawCol []byte) ([]byte, Kind) {
	switch {
	case jsonCol != nil:
		return jsonCol, JSON
	case rawCol != nil:
		return rawCol, Raw
	}
	return nil, None
}
