package idempotency

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// KeyFormat is the form of Idempotency-Key a route accepts.
type KeyFormat int

const (
	// KeyUUID (the default) accepts a 36-character hex UUID, any case, bare or
	// as a structured-field string, and stores it in lower case.
	KeyUUID KeyFormat = iota
	// KeyOpaque accepts 1 to MaxKeyLength visible ASCII characters or spaces,
	// bare or as a structured-field string, compared exactly ("AbC" is not
	// "abc"); the route needs Config.Scope or RouteConfig.MinKeyLength.
	KeyOpaque
)

// MaxKeyLength is the longest opaque key, in bytes.
const MaxKeyLength = 255

// minGuardKeyLength is the shortest MinKeyLength that stands in for a user
// scope on an opaque route: keys that short are not guessed.
const minGuardKeyLength = 16

// ErrInvalidKey is returned by ParseKey for a value that is not a key of
// the format.
var ErrInvalidKey = errors.New("idempotency: invalid idempotency key")

// ParseKey parses one Idempotency-Key header value (surrounding white space
// ignored) as a route of format does and returns the key as stored (a UUID
// in lower case, an opaque key exactly), or an error wrapping ErrInvalidKey.
func ParseKey(value string, format KeyFormat) (string, error) {
	var (
		key string
		ok  bool
	)
	switch format {
	case KeyUUID:
		key, ok = parseUUIDKey(value)
	case KeyOpaque:
		key, ok = parseOpaqueKey(value)
	default:
		return "", fmt.Errorf("idempotency: unknown KeyFormat %d", format)
	}
	if !ok {
		return "", fmt.Errorf("%w %q", ErrInvalidKey, value)
	}
	return key, nil
}

// parseUUIDKey validates a UUID key and returns it in lower case: its
// 36-character form, optionally as a quoted structured-field string.
func parseUUIDKey(v string) (string, bool) {
	v = strings.Trim(v, " \t")
	if len(v) == 38 && v[0] == '"' && v[37] == '"' {
		v = v[1:37]
	}
	if len(v) != 36 {
		return "", false
	}
	if _, err := uuid.Parse(v); err != nil { // at length 36 only the 8-4-4-4-12 hex form parses
		return "", false
	}
	return strings.ToLower(v), true // uuid's String form; no allocation when v already is

}

// parseOpaqueKey validates an opaque key and returns its content: 1 to
// MaxKeyLength characters from space to '~', bare, or as a
// structured-field string (RFC 8941 3.3.3: in double quotes, with \" and
// \\ the only escapes, nothing after the closing quote).
func parseOpaqueKey(v string) (string, bool) {
	v = strings.Trim(v, " \t")
	if len(v) > 0 && v[0] == '"' {
		return parseSFString(v)
	}
	if len(v) == 0 || len(v) > MaxKeyLength {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] > '~' {
			return "", false
		}
	}
	return v, true
}

// parseSFString returns the content of a structured-field string that is
// the whole of v.
func parseSFString(v string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 || b.Len() == 0 || b.Len() > MaxKeyLength {
				return "", false // parameters after it, empty, or too long
			}
			return b.String(), true
		case c < ' ' || c > '~':
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

// keyParser is a route's parsing of one header value: the stored key, or
// false for a value the route refuses.
type keyParser func(string) (string, bool)

// newKeyParser returns the parser of a validated route policy and the
// answer its refusals get.
func (rc *RouteConfig) newKeyParser() (keyParser, answer) {
	switch {
	case rc.ParseKey != nil:
		custom, minLen := rc.ParseKey, rc.MinKeyLength
		return func(v string) (string, bool) {
			k, err := custom(v)
			return k, err == nil && len(k) >= max(minLen, 1) && len(k) <= MaxKeyLength && storable(k)
		}, answerInvalidOpaqueKey
	case rc.KeyFormat == KeyOpaque:
		minLen := rc.MinKeyLength
		return func(v string) (string, bool) {
			k, ok := parseOpaqueKey(v)
			return k, ok && len(k) >= minLen
		}, answerInvalidOpaqueKey
	}
	return parseUUIDKey, answerInvalidKey
}

// validateKeys checks a route's key policy: an opaque or custom key is
// guarded by a user scope or a minimum length, since keys such as "all"
// or "admin" are guessed, and another client's guess would be answered
// with the first client's stored response.
func (rc *RouteConfig) validateKeys(scoped bool) error {
	opaque := rc.KeyFormat == KeyOpaque || rc.ParseKey != nil
	switch {
	case rc.KeyFormat != KeyUUID && rc.KeyFormat != KeyOpaque:
		return fmt.Errorf("idempotency: RouteConfig.KeyFormat %d is neither KeyUUID nor KeyOpaque", rc.KeyFormat)
	case rc.MinKeyLength < 0 || rc.MinKeyLength > MaxKeyLength:
		return fmt.Errorf("idempotency: RouteConfig.MinKeyLength must be between 0 and %d, got %d", MaxKeyLength, rc.MinKeyLength)
	case rc.MinKeyLength > 0 && !opaque:
		return errors.New("idempotency: RouteConfig.MinKeyLength applies to opaque keys only (KeyFormat KeyOpaque or ParseKey)")
	case opaque && !scoped && rc.MinKeyLength < minGuardKeyLength:
		return fmt.Errorf("idempotency: a route with opaque keys needs a user scope (Config.Scope) or RouteConfig.MinKeyLength of at least %d: "+
			"short unscoped keys are guessable, and a guess is answered with another client's response", minGuardKeyLength)
	case rc.Scoped && !scoped:
		return errors.New("idempotency: RouteConfig.Scoped on an HTTP route needs Config.Scope, the only scope of a request")
	}
	return nil
}

// needsScope reports whether a route refuses a request whose scope is
// empty: it says it is Scoped, or its opaque keys are guarded by the scope
// rather than by their length. An anonymous request would otherwise claim
// a short key in the one key space all anonymous clients share.
func (rc *RouteConfig) needsScope() bool {
	opaque := rc.KeyFormat == KeyOpaque || rc.ParseKey != nil
	return rc.Scoped || opaque && rc.MinKeyLength < minGuardKeyLength
}

// headerKey returns the request's one Idempotency-Key, parsed by the
// route. present is false when the header is absent; ok is false when it
// is not one valid key.
func headerKey(r *http.Request, parse keyParser) (key string, present, ok bool) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		return "", false, false
	}
	if len(values) == 1 {
		key, ok = parse(values[0])
	}
	return key, true, ok
}
