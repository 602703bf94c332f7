package seal

import (
	"encoding/binary"
	"net/http"
	"slices"
)

// The envelope is what is sealed: the body kind (one byte), the stored
// headers (a count of names, then each name with its count of values and
// the values, every string prefixed by its length as a uvarint, names
// sorted) and the body, the rest.

// envelopeSize is the encoded size of p, or a little more.
func envelopeSize(p Plain) int {
	n := 1 + binary.MaxVarintLen32 + len(p.Body)
	for name, values := range p.Header {
		n += 2*binary.MaxVarintLen32 + len(name)
		for _, v := range values {
			n += binary.MaxVarintLen32 + len(v)
		}
	}
	return n
}

// appendEnvelope appends p's envelope to b.
func appendEnvelope(b []byte, p Plain) []byte {
	b = append(b, p.Kind)
	b = binary.AppendUvarint(b, uint64(len(p.Header)))
	var small [8]string
	names := small[:0]
	for name := range p.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		values := p.Header[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	return append(b, p.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// parseEnvelope decodes an envelope; ok is false for a malformed one. The
// body is a slice of b. An envelope without headers has a nil Header, as a
// response recorded without any has.
func parseEnvelope(b []byte) (p Plain, ok bool) {
	d := decoder{b: b}
	if len(b) == 0 {
		return Plain{}, false
	}
	p.Kind, d.b = b[0], b[1:]
	names, ok := d.count()
	if !ok {
		return Plain{}, false
	}
	if names > 0 {
		p.Header = make(http.Header, names)
	}
	for range names {
		name, ok := d.str()
		if !ok {
			return Plain{}, false
		}
		n, ok := d.count()
		if !ok {
			return Plain{}, false
		}
		values := make([]string, 0, n)
		for range n {
			v, ok := d.str()
			if !ok {
				return Plain{}, false
			}
			values = append(values, v)
		}
		p.Header[name] = values
	}
	p.Body = d.b
	return p, true
}

// decoder reads an envelope's counts and strings, never past its end.
type decoder struct{ b []byte }

// count reads a count that cannot exceed the bytes left (each item takes
// at least one).
func (d *decoder) count() (int, bool) {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)-n) {
		return 0, false
	}
	d.b = d.b[n:]
	return int(v), true
}

func (d *decoder) str() (string, bool) {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)-n) {
		return "", false
	}
	s := string(d.b[n : n+int(v)])
	d.b = d.b[n+int(v):]
	return s, true
}
