// Package jcs canonicalises JSON request bodies for the request hash: RFC
// 8785 (JCS) member order and string escaping, numbers kept exactly as
// written. It is internal: the canonical form is part of the stored
// request hashes, and only the root package's hash framing may use it.
package jcs

import (
	"bytes"
	"cmp"
	"slices"
	"sync"
	"unicode"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects a body may have
// and still be canonicalised; deeper bodies are hashed as raw bytes. The
// parser keeps its own stack, so the limit bounds its memory, not recursion.
const MaxDepth = 1000

// canonicalizers recycles canonicalizer buffers, because a request hash is
// computed on every keyed request.
var canonicalizers = sync.Pool{
	New: func() any { return &Canonicalizer{} },
}

// Get returns a Canonicalizer from the pool; Release returns it.
func Get() *Canonicalizer { return canonicalizers.Get().(*Canonicalizer) }

// Canonical returns the canonical form of body and true, or nil and false
// when body is not JSON this package canonicalises (see
// Canonicalizer.Canonicalize). The result is a fresh slice the caller owns.
func Canonical(body []byte) ([]byte, bool) {
	c := Get()
	defer c.Release()
	out, ok := c.Canonicalize(body)
	if !ok {
		return nil, false
	}
	return bytes.Clone(out), true
}

// Canonicalizer holds the reusable state of one canonicalisation. Get one
// with Get and give it back with Release.
type Canonicalizer struct {
	out      []byte    // the canonical text being built
	keys     []byte    // decoded (unescaped) member names of the open objects
	members  []member  // members of the open objects, innermost last
	stack    []frame   // the open arrays and objects, innermost last
	reorders []reorder // the closed objects whose members are out of order
	sorted   []span    // their members, in canonical order
	folded   []byte    // case-folded member names of one large object
	folds    []span    // their spans in folded
	spans    []emit    // the work list of reorder
	scratch  []byte    // the reordered text, swapped with out
}

// member is one object member written to out: the text `"name":value` spans
// out[start:end], and keys[keyStart:keyEnd] is its name unescaped, for sorting
// and duplicate detection. It holds no pointers, so sorting moves plain words.
type member struct {
	start, end, keyStart, keyEnd int
}

// span is the text out[start:end].
type span struct{ start, end int }

// reorder is an object whose members must be written in another order: its
// members' text is out[start:end] (from its first name to its closing brace)
// and their spans, sorted, are sorted[mem:mem+n].
type reorder struct{ start, end, mem, n int }

// emit is a step of reorder: copy out[pos:end], or, when obj >= 0, write
// the members of reorders[obj] from the next one on.
type emit struct{ pos, end, obj, next int }

// frame is one open array or object. For an object, mem and keys are where
// its members begin in Canonicalizer.members and Canonicalizer.keys.
type frame struct {
	kind      byte // '[' or '{'
	mem, keys int
}

// Pooled buffers above these sizes are dropped, so one huge body does not pin
// its memory in the pool for good.
const (
	maxPooledBytes   = 64 << 10
	maxPooledMembers = 4 << 10
)

// Release resets c and returns it to the pool.
func (c *Canonicalizer) Release() {
	c.out = trimPooled(c.out, maxPooledBytes)
	c.keys = trimPooled(c.keys, maxPooledBytes)
	c.scratch = trimPooled(c.scratch, maxPooledBytes)
	c.reorders = trimPooled(c.reorders, maxPooledMembers)
	c.sorted = trimPooled(c.sorted, maxPooledMembers)
	c.folded = trimPooled(c.folded, maxPooledBytes)
	c.folds = trimPooled(c.folds, maxPooledMembers)
	c.spans = c.spans[:0] // at most 2*MaxDepth+1 long
	c.members = trimPooled(c.members, maxPooledMembers)
	c.stack = trimPooled(c.stack, MaxDepth)
	canonicalizers.Put(c)
}

// trimPooled empties s, and forgets it when it grew too large to keep.
func trimPooled[S ~[]E, E any](s S, limit int) S {
	if cap(s) > limit {
		return nil
	}
	return s[:0]
}

// Canonicalize returns the canonical form of in, valid until c is released,
// and reports whether in is JSON this package canonicalises: exactly one JSON value by the RFC
// 8259 grammar, optionally surrounded by white space, in valid UTF-8, with
// no lone surrogate escapes, no two member names of one object that are
// equal, exactly or under Unicode case folding (compared after unescaping:
// foldsAlike), and no more than MaxDepth levels of arrays and objects.
//
// The canonical form follows RFC 8785 (JCS) for member order (names sorted by
// their UTF-16 code units) and string escaping, without white space, but keeps
// every number exactly as written: the hash must tell 1.0 from 1 if the
// handler can, and must not depend on float rounding.
//
// It parses in one pass without recursion, so nesting costs heap, not stack,
// and the depth limit is checked before each array or object is entered. The
// text is written in input order; objects whose members are out of order are
// noted and put in order by one more pass, so the work stays linear in the
// body's size however deep the reordered objects nest.
func (c *Canonicalizer) Canonicalize(in []byte) ([]byte, bool) {
	c.out, c.keys, c.members, c.stack = c.out[:0], c.keys[:0], c.members[:0], c.stack[:0]
	c.reorders, c.sorted = c.reorders[:0], c.sorted[:0]
	if !c.parse(in) {
		return nil, false
	}
	if len(c.reorders) > 0 {
		c.reorder()
	}
	return c.out, true
}

// parse writes the compact text of in to c.out, names escaped as RFC 8785
// does, members in input order, and notes the objects to reorder.
func (c *Canonicalizer) parse(in []byte) bool {
	var ok bool
	i := 0
values: // parse one value at in[i]
	for {
		i = skipWhiteSpace(in, i)
		if i >= len(in) {
			return false
		}
		switch in[i] {
		case '{', '[':
			open, end := in[i], in[i]+2 // '}' and ']' follow '{' and '[' by two
			if len(c.stack) >= MaxDepth {
				return false
			}
			c.out = append(c.out, open)
			i = skipWhiteSpace(in, i+1)
			if i < len(in) && in[i] == end {
				c.out = append(c.out, end)
				i++
				break // an empty container is a complete value
			}
			c.stack = append(c.stack, frame{kind: open, mem: len(c.members), keys: len(c.keys)})
			if open == '{' {
				if i, ok = c.memberName(in, i); !ok {
					return false
				}
			}
			continue values
		case '"':
			if i, ok = c.str(in, i, false); !ok {
				return false
			}
		case 't':
			if i, ok = c.literal(in, i, "true"); !ok {
				return false
			}
		case 'f':
			if i, ok = c.literal(in, i, "false"); !ok {
				return false
			}
		case 'n':
			if i, ok = c.literal(in, i, "null"); !ok {
				return false
			}
		default:
			start := i
			if i, ok = scanNumber(in, i); !ok {
				return false
			}
			c.out = append(c.out, in[start:i]...)
		}

		// A value has ended: continue its container or close containers.
		for {
			i = skipWhiteSpace(in, i)
			if len(c.stack) == 0 {
				return i == len(in) // no trailing data
			}
			if i >= len(in) {
				return false
			}
			top := c.stack[len(c.stack)-1]
			if top.kind == '[' {
				switch in[i] {
				case ',':
					c.out = append(c.out, ',')
					i++
					continue values
				case ']':
					c.out = append(c.out, ']')
					i++
					c.stack = c.stack[:len(c.stack)-1]
					continue
				}
				return false
			}
			c.members[len(c.members)-1].end = len(c.out)
			switch in[i] {
			case ',':
				c.out = append(c.out, ',')
				if i, ok = c.memberName(in, skipWhiteSpace(in, i+1)); !ok {
					return false
				}
				continue values
			case '}':
				if !c.closeObject(c.members[top.mem:]) {
					return false
				}
				c.members, c.keys = c.members[:top.mem], c.keys[:top.keys]
				c.out = append(c.out, '}')
				i++
				c.stack = c.stack[:len(c.stack)-1]
				continue
			}
			return false
		}
	}
}

// memberName parses a member name and its colon at in[i], writes them to
// c.out and starts a member, and returns the index of the member's value.
func (c *Canonicalizer) memberName(in []byte, i int) (int, bool) {
	if i >= len(in) || in[i] != '"' {
		return 0, false
	}
	start, keyStart := len(c.out), len(c.keys)
	i, ok := c.str(in, i, true)
	if !ok {
		return 0, false
	}
	i = skipWhiteSpace(in, i)
	if i >= len(in) || in[i] != ':' {
		return 0, false
	}
	c.out = append(c.out, ':')
	c.members = append(c.members, member{start: start, keyStart: keyStart, keyEnd: len(c.keys)})
	return i + 1, true
}

// closeObject sorts the members ms of the object being closed, notes the
// object for reordering when they were out of order, and reports false when
// two of them share a name, exactly or under case folding (foldsAlike).
func (c *Canonicalizer) closeObject(ms []member) bool {
	if c.foldsAlike(ms) {
		return false
	}
	inOrder := true
	for k := 1; k < len(ms); k++ {
		if compareUTF16(c.key(ms[k-1]), c.key(ms[k])) >= 0 {
			inOrder = false
			break
		}
	}
	if inOrder { // the common case: nothing to move
		return true
	}
	start := ms[0].start
	slices.SortFunc(ms, func(a, b member) int { return compareUTF16(c.key(a), c.key(b)) })
	c.reorders = append(c.reorders, reorder{start: start, end: len(c.out), mem: len(c.sorted), n: len(ms)})
	for _, m := range ms {
		c.sorted = append(c.sorted, span{m.start, m.end})
	}
	return true
}

// foldsAlike reports whether two of the names of ms are equal under Unicode
// simple case folding, as strings.EqualFold compares them (exact duplicates
// included). encoding/json matches names to struct fields that way, with
// Unicode folding (K and the Kelvin sign, s and the long s), and the last
// match wins: {"qty":1,"QTY":1000} and {"QTY":1000,"qty":1} decode to
// different orders, so sorting them into one canonical text would make two
// different requests one. Such objects are hashed raw instead.
func (c *Canonicalizer) foldsAlike(ms []member) bool {
	if len(ms) <= smallObject {
		for i := 1; i < len(ms); i++ {
			for j := range i {
				if bytes.EqualFold(c.key(ms[i]), c.key(ms[j])) {
					return true
				}
			}
		}
		return false
	}
	// Larger objects: sort the folded names, so alike ones are neighbours.
	c.folded, c.folds = c.folded[:0], c.folds[:0]
	for _, m := range ms {
		start := len(c.folded)
		c.folded = appendFolded(c.folded, c.key(m))
		c.folds = append(c.folds, span{start, len(c.folded)})
	}
	name := func(s span) []byte { return c.folded[s.start:s.end] }
	slices.SortFunc(c.folds, func(a, b span) int { return bytes.Compare(name(a), name(b)) })
	for k := 1; k < len(c.folds); k++ {
		if bytes.Equal(name(c.folds[k-1]), name(c.folds[k])) {
			return true
		}
	}
	return false
}

// smallObject is the member count up to which foldsAlike compares every
// pair of names, which is cheaper than folding and sorting them.
const smallObject = 16

// appendFolded appends name with every rune replaced by the smallest rune of
// its simple case folding orbit, so two names are equal under
// strings.EqualFold exactly when their folded forms are equal.
func appendFolded(out, name []byte) []byte {
	for i := 0; i < len(name); {
		if b := name[i]; b < utf8.RuneSelf {
			if 'a' <= b && b <= 'z' {
				b -= 'a' - 'A'
			}
			out = append(out, b)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		for {
			f := unicode.SimpleFold(r)
			if f <= r { // wrapped around: f is the orbit's smallest
				r = f
				break
			}
			r = f
		}
		out = utf8.AppendRune(out, r)
		i += n
	}
	return out
}

// key returns the unescaped name of m.
func (c *Canonicalizer) key(m member) []byte { return c.keys[m.keyStart:m.keyEnd] }

// reorder rewrites c.out with the members of every noted object in sorted
// order. It copies each byte once: a member's text is copied where it
// belongs, and the reordered objects inside it are found by position as the
// copy reaches them. The work list stands in for recursion.
func (c *Canonicalizer) reorder() {
	// Objects closed inner first; find them by position instead.
	slices.SortFunc(c.reorders, func(a, b reorder) int { return cmp.Compare(a.start, b.start) })
	dst := c.scratch[:0]
	c.spans = append(c.spans[:0], emit{pos: 0, end: len(c.out), obj: -1})
	for len(c.spans) > 0 {
		top := &c.spans[len(c.spans)-1]
		if top.obj >= 0 { // write the next member of an object, or close it
			r := c.reorders[top.obj]
			if top.next == r.n {
				c.spans = c.spans[:len(c.spans)-1]
				continue
			}
			if top.next > 0 {
				dst = append(dst, ',')
			}
			m := c.sorted[r.mem+top.next]
			top.next++
			c.spans = append(c.spans, emit{pos: m.start, end: m.end, obj: -1})
			continue
		}
		// Copy text up to the next reordered object inside it, if any;
		// objects nest, so the first one to start is the outermost. It
		// starts after pos: a member span starts where its own object does.
		k, _ := slices.BinarySearchFunc(c.reorders, top.pos+1, func(r reorder, pos int) int { return cmp.Compare(r.start, pos) })
		if k == len(c.reorders) || c.reorders[k].start >= top.end {
			dst = append(dst, c.out[top.pos:top.end]...)
			c.spans = c.spans[:len(c.spans)-1]
			continue
		}
		r := c.reorders[k]
		dst = append(dst, c.out[top.pos:r.start]...)
		top.pos = r.end // resume at the object's closing brace
		c.spans = append(c.spans, emit{obj: k})
	}
	c.out, c.scratch = dst, c.out
}

// compareUTF16 orders two valid UTF-8 strings by their UTF-16 code units, the
// member order of RFC 8785. It equals byte order except where a character in
// U+E000..U+FFFF meets one above U+FFFF: in UTF-16 the latter starts with a
// surrogate (0xD800..0xDBFF) and so sorts first.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return cmp.Compare(len(a), len(b))
	}
	// The strings share a[:i], so a[i] and b[i] are both lead bytes or both
	// continuation bytes of runes with the same lead byte. Lead bytes 0xEE
	// and 0xEF start U+E000..U+FFFF; 0xF0..0xF4 start supplementary runes.
	x, y := a[i], b[i]
	if x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0) {
		if x >= 0xF0 {
			return -1
		}
		return 1
	}
	return cmp.Compare(x, y)
}

// str parses the JSON string at in[i] (an opening quote) and writes it to
// c.out with RFC 8785 escaping; for a member name it also appends the
// unescaped text to c.keys. It returns the index after the closing quote.
func (c *Canonicalizer) str(in []byte, i int, key bool) (int, bool) {
	c.out = append(c.out, '"')
	i++
	for {
		// Copy a run of characters that are written as they are.
		start := i
		for i < len(in) {
			b := in[i]
			if b < utf8.RuneSelf {
				if b < 0x20 || b == '"' || b == '\\' {
					break
				}
				i++
				continue
			}
			r, n := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && n == 1 {
				return 0, false // invalid UTF-8
			}
			i += n
		}
		c.out = append(c.out, in[start:i]...)
		if key {
			c.keys = append(c.keys, in[start:i]...)
		}
		if i >= len(in) {
			return 0, false // unterminated
		}
		switch in[i] {
		case '"':
			c.out = append(c.out, '"')
			return i + 1, true
		case '\\':
			r, n, ok := unescape(in, i)
			if !ok {
				return 0, false
			}
			i += n
			c.out = appendJCSRune(c.out, r)
			if key {
				c.keys = utf8.AppendRune(c.keys, r)
			}
		default:
			return 0, false // a raw control character
		}
	}
}

// unescape decodes the escape sequence at in[i] (a backslash), joining a
// surrogate pair into one rune, and returns the rune and the sequence's
// length. A lone or reversed surrogate is rejected: it has no UTF-8 form.
func unescape(in []byte, i int) (rune, int, bool) {
	if i+1 >= len(in) {
		return 0, 0, false
	}
	switch in[i+1] {
	case '"', '\\', '/':
		return rune(in[i+1]), 2, true
	case 'b':
		return '\b', 2, true
	case 'f':
		return '\f', 2, true
	case 'n':
		return '\n', 2, true
	case 'r':
		return '\r', 2, true
	case 't':
		return '\t', 2, true
	case 'u':
		r, ok := hex4(in, i+2)
		if !ok {
			return 0, 0, false
		}
		switch {
		case r < 0xD800 || r > 0xDFFF:
			return r, 6, true
		case r >= 0xDC00:
			return 0, 0, false // a low surrogate with no high one before it
		}
		if i+7 >= len(in) || in[i+6] != '\\' || in[i+7] != 'u' {
			return 0, 0, false // a high surrogate with no low one after it
		}
		lo, ok := hex4(in, i+8)
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return 0, 0, false
		}
		return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12, true
	}
	return 0, 0, false
}

// hex4 decodes the four hex digits at in[i:i+4].
func hex4(in []byte, i int) (rune, bool) {
	if i+4 > len(in) {
		return 0, false
	}
	var r rune
	for _, b := range in[i : i+4] {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(b)
	}
	return r, true
}

// appendJCSRune appends r as RFC 8785 writes it inside a string: the short
// escapes for '"', '\\' and \b \f \n \r \t, \u00xx in lower-case hex for other
// control characters, and the character itself in UTF-8 for everything else.
func appendJCSRune(out []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(out, '\\', byte(r))
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	if r < 0x20 {
		const digits = "0123456789abcdef"
		return append(out, '\\', 'u', '0', '0', digits[r>>4], digits[r&0xF])
	}
	return utf8.AppendRune(out, r)
}

// literal checks that the literal word (true, false or null) is at in[i] and
// writes it to c.out.
func (c *Canonicalizer) literal(in []byte, i int, word string) (int, bool) {
	if len(in)-i < len(word) || string(in[i:i+len(word)]) != word {
		return 0, false
	}
	c.out = append(c.out, word...)
	return i + len(word), true
}

// scanNumber returns the end of the JSON number at in[i], checked against the
// RFC 8259 grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// The number's text is kept as it is; only its syntax matters here.
func scanNumber(in []byte, i int) (int, bool) {
	if i < len(in) && in[i] == '-' {
		i++
	}
	switch {
	case i >= len(in):
		return 0, false
	case in[i] == '0':
		i++
	case '1' <= in[i] && in[i] <= '9':
		i = skipDigits(in, i+1)
	default:
		return 0, false
	}
	if i < len(in) && in[i] == '.' {
		j := skipDigits(in, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		j := skipDigits(in, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

// skipDigits returns the index of the first non-digit at or after in[i].
func skipDigits(in []byte, i int) int {
	for i < len(in) && '0' <= in[i] && in[i] <= '9' {
		i++
	}
	return i
}

// skipWhiteSpace returns the index of the first byte at or after in[i] that
// is not JSON white space, which is insignificant between tokens.
func skipWhiteSpace(in []byte, i int) int {
	for i < len(in) {
		switch in[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}
