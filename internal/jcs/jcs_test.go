package jcs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idempotency/internal/jcs/jcsvectors"
)

const vectorsFile = "../../testdata/hash_vectors.json"

// TestVectors checks every golden vector's canonical form (or that its
// body is refused, to be hashed raw).
func TestVectors(t *testing.T) {
	t.Parallel()
	for _, v := range jcsvectors.Load(t, vectorsFile) {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			got, ok := Canonical(v.Bytes(t))
			switch {
			case v.Canonical == nil && ok:
				t.Errorf("Canonical accepted the body as %q, want it hashed raw", got)
			case v.Canonical != nil && !ok:
				t.Errorf("Canonical rejected the body, want %q", *v.Canonical)
			case v.Canonical != nil && string(got) != *v.Canonical:
				t.Errorf("Canonical\n got %q\nwant %q", got, *v.Canonical)
			}
		})
	}
}

// TestDecodesAlike checks that canonicalisation never changes
// the value: encoding/json decodes the body and its canonical form to the same
// thing, numbers compared as their text.
func TestDecodesAlike(t *testing.T) {
	t.Parallel()
	for _, v := range jcsvectors.Load(t, vectorsFile) {
		if v.Canonical == nil {
			continue
		}
		a, errA := decodeJSONNumbers([]byte(*v.Canonical))
		b, errB := decodeJSONNumbers(v.Bytes(t))
		if errA != nil || errB != nil {
			t.Errorf("%s: decode: %v, %v", v.Name, errA, errB)
			continue
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: the canonical form decodes to %v, the body to %v", v.Name, a, b)
		}
	}
}

// decodeJSONNumbers decodes data with numbers kept as json.Number text, as
// the canonical form keeps them.
func decodeJSONNumbers(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// TestDeepNesting checks that a body nested far beyond the limit is
// refused without exhausting the stack: returning at all is the proof, the
// bound only keeps a regression from hanging the run.
func TestDeepNesting(t *testing.T) {
	t.Parallel()
	for name, body := range deepBodies(200_000) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			done := make(chan bool, 1)
			go func() {
				_, ok := Canonical([]byte(body))
				done <- ok
			}()
			select {
			case ok := <-done:
				if ok {
					t.Error("Canonical accepted a body nested 200,000 deep")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Canonical of a body nested 200,000 deep did not return")
			}
		})
	}
}

// deepBodies returns bodies nested depth deep.
func deepBodies(depth int) map[string]string {
	return map[string]string{
		"arrays":          strings.Repeat("[", depth) + strings.Repeat("]", depth),
		"arrays unclosed": strings.Repeat("[", depth),
		"objects":         strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth),
	}
}

// TestCompareUTF16 checks the member order of RFC 8785 around the place where
// UTF-16 and UTF-8 disagree.
func TestCompareUTF16(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "a", -1},
		{"a", "ab", -1},
		{"b", "ab", 1},
		{"\u20ac", "\U0001F600", -1}, // U+20AC < D83D
		{"\ufb33", "\U0001F600", 1},  // U+FB33 > D83D, though E.. < F0.. in UTF-8
		{"\ue000", "\U00010000", 1},  // the lowest of each
		{"\uffff", "\U0010FFFF", 1},  // the highest of each
		{"\ud7ff", "\U00010000", -1}, // just below the surrogates
		{"\U0001F600", "\U0001F601", -1},
		{"\U00010400", "\U0001F600", -1},
		{"x\ufb33", "x\U0001F600", 1},
		{"\u00e9", "\u00ea", -1},
	}
	for _, tt := range tests {
		if got := compareUTF16([]byte(tt.a), []byte(tt.b)); got != tt.want {
			t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := compareUTF16([]byte(tt.b), []byte(tt.a)); got != -tt.want {
			t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", tt.b, tt.a, got, -tt.want)
		}
	}
}

// TestAppendFoldedMatchesEqualFold checks the folded form that large objects
// are compared by against strings.EqualFold, which small objects (and
// encoding/json) use: for every rune, the runes of its folding orbit fold to
// one form, and no rune outside the orbit folds to it.
func TestAppendFoldedMatchesEqualFold(t *testing.T) {
	t.Parallel()
	byForm := make(map[string]rune)
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		s := string(r)
		form := string(appendFolded(nil, []byte(s)))
		if first, ok := byForm[form]; !ok {
			byForm[form] = r
		} else if !strings.EqualFold(string(first), s) {
			t.Fatalf("%U and %U fold to the same form %+q, but strings.EqualFold says they differ", first, r, form)
		}
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if other := string(appendFolded(nil, []byte(string(f)))); other != form {
				t.Fatalf("%U folds to %+q, %U of its orbit to %+q", r, form, f, other)
			}
		}
	}
}

// TestFoldsAlikeBothPaths: small objects compare names pairwise, large ones
// sort their folded names; both find the same pairs.
func TestFoldsAlikeBothPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want bool
	}{
		{"qty", "QTY", true},
		{"k", "\u212a", true},      // Kelvin sign
		{"S", "\u017f", true},      // long s
		{"\u03a3", "\u03c2", true}, // capital and final sigma
		{"id", "id", true},
		{"i", "\u0130", false}, // dotted capital I
		{"ss", "\u00df", false},
		{"qty", "qtz", false},
	}
	for _, tt := range tests {
		for _, pad := range []int{0, smallObject} { // pairwise, then sorted
			names := []string{tt.a}
			for k := range pad {
				names = append(names, fmt.Sprintf("pad%02d", k))
			}
			names = append(names, tt.b)
			c := Get()
			var ms []member
			for _, n := range names {
				start := len(c.keys)
				c.keys = append(c.keys, n...)
				ms = append(ms, member{keyStart: start, keyEnd: len(c.keys)})
			}
			got := c.foldsAlike(ms)
			c.Release()
			if got != tt.want {
				t.Errorf("%+q and %+q among %d names: foldsAlike = %v, want %v", tt.a, tt.b, len(names), got, tt.want)
			}
		}
	}
}

// TestCanonicalOwnsResult checks that Canonical's result is not a
// pooled buffer a later call could overwrite.
func TestCanonicalOwnsResult(t *testing.T) {
	t.Parallel()
	first, ok := Canonical([]byte(`{"b":1,"a":2}`))
	if !ok {
		t.Fatal("Canonical rejected a valid body")
	}
	for range 10 {
		Canonical([]byte(`["xxxxxxxxxxxxxxxx"]`))
	}
	if string(first) != `{"a":2,"b":1}` {
		t.Errorf("Canonical result changed to %q", first)
	}
}

// FuzzCanonical checks that Canonical never panics, accepts only
// what encoding/json accepts, keeps the decoded value, and that its output is
// accepted and is its own canonical form.
func FuzzCanonical(f *testing.F) {
	for _, v := range jcsvectors.Load(f, vectorsFile) {
		// The deep-nesting vectors are kilobytes of brackets: as seeds they
		// slow every mutation and minimisation, and the depth limit has its
		// own tests.
		if body := v.Bytes(f); len(body) <= 512 {
			f.Add(body)
		}
	}
	for _, s := range []string{`{"b":{"d":1,"c":2},"a":[3,{"f":4,"e":5}]}`, `"\u00e9\/"`, `-0.0e-0`, `[]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := Canonical(body)
		if !json.Valid(body) {
			if ok {
				t.Fatalf("Canonical accepted %q, which encoding/json rejects, as %q", body, got)
			}
			return
		}
		if !ok {
			return // valid JSON that is too deep, has names alike under case folding, bad UTF-8 or lone surrogates
		}
		again, ok := Canonical(got)
		if !ok {
			t.Fatalf("Canonical rejected its own output %q (from %q)", got, body)
		}
		if !bytes.Equal(again, got) {
			t.Fatalf("canonical form is not a fixed point:\n%q\n%q", got, again)
		}
		a, errA := decodeJSONNumbers(body)
		b, errB := decodeJSONNumbers(got)
		if errA != nil || errB != nil {
			t.Fatalf("decode %q: %v; decode %q: %v", body, errA, got, errB)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q decodes to %v, its canonical form %q to %v", body, a, got, b)
		}
	})
}
