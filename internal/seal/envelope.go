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

// appendEnvelope appends p's envelope to a buffer it sizes once.
func appendEnvelope(b []byte, p Plain) []byte {
	var small [8]string
	names := small[:0]
	size := 1 + binary.MaxVarintLen32 + len(p.Body)
	for name, values := range p.Header {
		names = append(names, name)
		size += 2*binary.MaxVarintLen32 + len(name)
		for _, v := range values {
			size += binary.MaxVarintLen32 + len(v)
		}
	}
	slices.Sort(names)
	b = slices.Grow(b, size)
	b = append(b, p.Kind)
	b = binary.AppendUvarint(b, uint64(len(names)))
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
// response recorded without any has. It reads the headers twice: first to
// check them and count their values, then into one string and one slice of
// values for them all, so a replay allocates little.
func parseEnvelope(b []byte) (p Plain, ok bool) {
	if len(b) == 0 {
		return Plain{}, false
	}
	p.Kind = b[0]
	d := decoder{b: b[1:]}
	names, ok := d.count()
	values := 0
	for i := 0; ok && i < names; i++ {
		var n int
		if ok = d.skip(); ok {
			n, ok = d.count()
		}
		for j := 0; ok && j < n; j++ {
			ok = d.skip()
		}
		values += n
	}
	if !ok {
		return Plain{}, false
	}
	p.Body = d.b
	if names == 0 {
		return p, true
	}
	h := headerDecoder{s: string(b[1 : len(b)-len(d.b)]), all: make([]string, 0, values)}
	h.count() // names, read above
	p.Header = make(http.Header, names)
	for range names {
		name := h.str()
		n := h.count()
		start := len(h.all)
		for range n {
			h.all = append(h.all, h.str())
		}
		p.Header[name] = h.all[start:len(h.all):len(h.all)]
	}
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

// skip passes over a string.
func (d *decoder) skip() bool {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)-n) {
		return false
	}
	d.b = d.b[n+int(v):]
	return true
}

// headerDecoder reads headers decoder has checked, as substrings of one
// string.
type headerDecoder struct {
	s   string
	all []string
}

func (h *headerDecoder) count() int {
	v, n := uvarint(h.s)
	h.s = h.s[n:]
	return int(v)
}

func (h *headerDecoder) str() string {
	v, n := uvarint(h.s)
	out := h.s[n : n+int(v)]
	h.s = h.s[n+int(v):]
	return out
}

// uvarint is binary.Uvarint of a string known to hold a valid one.
func uvarint(s string) (uint64, int) {
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
	return v, len(s)
}
