package storedbody

// How the stores write and read the response_headers column: JSON, as
// encoding/json writes and reads an http.Header, with a direct path for the
// usual headers (printable ASCII, no escapes) that gives the same bytes and
// the same values without reflection.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
)

// DecodeHeaders decodes a response_headers column as json.Unmarshal into
// an http.Header does. The usual column (an object of arrays of printable
// ASCII strings without escapes) is parsed directly, its names and values
// slices of one string; anything else, errors included, goes through
// json.Unmarshal.
func DecodeHeaders(b []byte) (http.Header, error) {
	if h, ok := parsePlainHeaders(b); ok {
		return h, nil
	}
	var h http.Header
	err := json.Unmarshal(b, &h)
	return h, err
}

// parsePlainHeaders parses b when it is an object of string arrays whose
// strings are printable ASCII without escapes, the form EncodeHeaders
// writes; ok is false for anything else (null, escapes,
// other bytes, any syntax error), which the caller hands to json.Unmarshal.
// Like json.Unmarshal, a repeated name keeps its last value and an empty
// array is an empty, non-nil slice.
func parsePlainHeaders(b []byte) (h http.Header, ok bool) {
	p := plainJSON{s: string(b)}
	if !p.byte('{') {
		return nil, false
	}
	h = make(http.Header)
	if p.byte('}') {
		return h, p.end()
	}
	for {
		name, ok := p.str()
		if !ok || !p.byte(':') || !p.byte('[') {
			return nil, false
		}
		values := []string{}
		if !p.byte(']') {
			for {
				v, ok := p.str()
				if !ok {
					return nil, false
				}
				values = append(values, v)
				if p.byte(']') {
					break
				}
				if !p.byte(',') {
					return nil, false
				}
			}
		}
		h[name] = values
		if p.byte('}') {
			return h, p.end()
		}
		if !p.byte(',') {
			return nil, false
		}
	}
}

// plainJSON reads the tokens parsePlainHeaders accepts from s.
type plainJSON struct {
	s string
	i int
}

// space skips JSON white space.
func (p *plainJSON) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

// byte reads c after white space, if it comes next.
func (p *plainJSON) byte(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (p *plainJSON) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	for j := p.i; j < len(p.s); j++ {
		switch c := p.s[j]; {
		case c == '"':
			v := p.s[p.i:j]
			p.i = j + 1
			return v, true
		case c < ' ' || c > '~' || c == '\\':
			return "", false
		}
	}
	return "", false
}

// end reports whether only white space is left.
func (p *plainJSON) end() bool {
	p.space()
	return p.i == len(p.s)
}

// EncodeHeaders returns h as the JSON of an object of string arrays, the
// bytes json.Marshal writes, or nil (NULL) when h is nil. Values holding a
// NUL byte are left out: HTTP forbids them (RFC 9110, section 5.5) and a
// JSON column cannot store them.
func EncodeHeaders(h http.Header) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	if b, ok := appendPlainHeaders(nil, h); ok {
		return b, nil
	}
	return json.Marshal(withoutNUL(h))
}

// appendPlainHeaders appends h as json.Marshal encodes it (names sorted,
// a nil value null) when every name and value is plain: printable ASCII
// that json.Marshal writes as it is (no '"', '\\', '<', '>' or '&'). ok
// is false for any other header, which the caller hands to json.Marshal.
func appendPlainHeaders(b []byte, h http.Header) (_ []byte, ok bool) {
	var names [8]string
	sorted := names[:0]
	size := 2
	for k, vs := range h {
		if !plainString(k) {
			return b, false
		}
		size += len(k) + 6
		for _, v := range vs {
			if !plainString(v) {
				return b, false
			}
			size += len(v) + 3
		}
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	b = slices.Grow(b, size)
	b = append(b, '{')
	for i, k := range sorted {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, '"', ':')
		vs := h[k]
		if vs == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range vs {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, v...)
			b = append(b, '"')
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

// plainString reports whether json.Marshal writes s between its quotes as
// it is.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < ' ' || c > '~', c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
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
