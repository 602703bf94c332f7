package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// updateHashVectors rewrites the hash fields of testdata/hash_vectors.json
// from the implementation. Only use it after checking the canonical forms,
// which are written by hand and never rewritten.
var updateHashVectors = flag.Bool("update-hash-vectors", false, "rewrite the hashes in "+hashVectorsFile)

const hashVectorsFile = "testdata/hash_vectors.json"

// hashVector is one golden request: its canonical body (nil when the body is
// hashed raw) and its request hash.
type hashVector struct {
	Name       string  `json:"name"`
	Note       string  `json:"note,omitempty"`
	Method     string  `json:"method"`
	Path       string  `json:"path"`
	Query      string  `json:"query"`
	Body       *string `json:"body,omitempty"`        // the body as text
	BodyBase64 string  `json:"body_base64,omitempty"` // or, for bodies that are not UTF-8, as base64
	Canonical  *string `json:"canonical"`
	SameAs     string  `json:"same_as,omitempty"` // the vector whose hash this one must equal
	Hash       string  `json:"hash"`
}

// body returns the vector's body bytes.
func (v hashVector) body(t testing.TB) []byte {
	t.Helper()
	if v.BodyBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(v.BodyBase64)
		if err != nil {
			t.Fatalf("%s: body_base64: %v", v.Name, err)
		}
		return b
	}
	if v.Body == nil {
		t.Fatalf("%s: neither body nor body_base64", v.Name)
	}
	return []byte(*v.Body)
}

// loadHashVectors reads the golden vectors, so every test checks the same
// requests.
func loadHashVectors(t testing.TB) []hashVector {
	t.Helper()
	data, err := os.ReadFile(hashVectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var vs []hashVector
	if err := json.Unmarshal(data, &vs); err != nil {
		t.Fatalf("%s: %v", hashVectorsFile, err)
	}
	if len(vs) < 24 {
		t.Fatalf("%s: %d vectors, want at least 24", hashVectorsFile, len(vs))
	}
	return vs
}

// writeHashVectors writes vs one per line, so a change to one vector is a
// one-line diff.
func writeHashVectors(t *testing.T, vs []hashVector) {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for k, v := range vs {
		var line bytes.Buffer
		enc := json.NewEncoder(&line)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		writeVisible(&buf, bytes.TrimSuffix(line.Bytes(), []byte("\n")))
		if k < len(vs)-1 {
			buf.WriteByte(',')
		}
		buf.WriteByte('\n')
	}
	buf.WriteString("]\n")
	if err := os.WriteFile(hashVectorsFile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeVisible copies encoded JSON to buf with invisible characters (DEL,
// C1 controls, a BOM) as \u escapes, so the file shows every byte that
// matters. They can only occur inside strings, where the escape means the same.
func writeVisible(buf *bytes.Buffer, encoded []byte) {
	for _, r := range string(encoded) {
		switch {
		case r < utf8.RuneSelf && r != 0x7f, unicode.IsPrint(r):
			buf.WriteRune(r)
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(buf, `\u%04x\u%04x`, hi, lo)
		default:
			fmt.Fprintf(buf, `\u%04x`, r)
		}
	}
}

// TestHashVectors checks every golden vector's canonical form and hash, so a
// change that would make stored keys answer 422 to their own retries fails
// here.
func TestHashVectors(t *testing.T) {
	vs := loadHashVectors(t)
	if *updateHashVectors {
		for k := range vs {
			vs[k].Hash = requestHash(vs[k].Method, vs[k].Path, vs[k].Query, vs[k].body(t))
		}
		writeHashVectors(t, vs)
	}
	t.Parallel()
	hexHash := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			body := v.body(t)
			got, ok := canonicalJSON(body)
			switch {
			case v.Canonical == nil && ok:
				t.Errorf("canonicalJSON accepted the body as %q, want it hashed raw", got)
			case v.Canonical != nil && !ok:
				t.Errorf("canonicalJSON rejected the body, want %q", *v.Canonical)
			case v.Canonical != nil && string(got) != *v.Canonical:
				t.Errorf("canonicalJSON\n got %q\nwant %q", got, *v.Canonical)
			}
			h := requestHash(v.Method, v.Path, v.Query, body)
			if !hexHash.MatchString(h) {
				t.Errorf("requestHash = %q, want 64 lower-case hex characters", h)
			}
			if h != v.Hash {
				t.Errorf("requestHash = %s, want %s", h, v.Hash)
			}
			if want := referenceHash(v.Method, v.Path, v.Query, v.Canonical, body); h != want {
				t.Errorf("requestHash = %s, the documented framing gives %s", h, want)
			}
		})
	}
}

// referenceHash spells out the framing documented on hashRequest, so the
// golden hashes are pinned to the documentation and not only to the code.
func referenceHash(method, path, query string, canonical *string, body []byte) string {
	kind, payload := "raw", body
	if canonical != nil {
		kind, payload = "json", []byte(*canonical)
	}
	var msg []byte
	for _, field := range []string{method, path, query, kind} {
		msg = binary.BigEndian.AppendUint64(msg, uint64(len(field)))
		msg = append(msg, field...)
	}
	sum := sha256.Sum256(append(msg, payload...))
	return hex.EncodeToString(sum[:])
}

// TestHashVectorsDistinct checks that vectors hash alike exactly when they
// are marked same_as: another path, query, method or body (raw or JSON) must
// never share a hash, while two encodings of one JSON value must.
func TestHashVectorsDistinct(t *testing.T) {
	t.Parallel()
	vs := loadHashVectors(t)
	group := make(map[string]string, len(vs)) // vector name -> same_as root
	for _, v := range vs {
		group[v.Name] = v.Name
		if v.SameAs != "" {
			group[v.Name] = v.SameAs
		}
	}
	for a, va := range vs {
		for _, vb := range vs[a+1:] {
			same := group[va.Name] == group[vb.Name]
			if same && va.Hash != vb.Hash {
				t.Errorf("%s and %s: hashes differ, want equal", va.Name, vb.Name)
			}
			if !same && va.Hash == vb.Hash {
				t.Errorf("%s and %s: hashes are equal, want different", va.Name, vb.Name)
			}
		}
	}
	for _, v := range vs {
		if _, ok := group[v.SameAs]; v.SameAs != "" && !ok {
			t.Errorf("%s: same_as names no vector: %q", v.Name, v.SameAs)
		}
	}
}

// TestRequestHashRawNeverMatchesJSON checks the distinct prefix: the raw
// framing of bytes that equal a canonical JSON text (as a body too deep to be
// JSON can) never hashes like that JSON body.
func TestRequestHashRawNeverMatchesJSON(t *testing.T) {
	t.Parallel()
	for _, v := range loadHashVectors(t) {
		if v.Canonical == nil {
			continue
		}
		c := canonicalizers.Get().(*canonicalizer)
		raw := c.hashRequest(v.Method, v.Path, v.Query, hashKindRaw, []byte(*v.Canonical))
		c.release()
		if raw == v.Hash {
			t.Errorf("%s: the raw framing of the canonical text hashes like the JSON body", v.Name)
		}
	}
}

// TestCanonicalJSONDecodesAlike checks that canonicalisation never changes
// the value: encoding/json decodes the body and its canonical form to the same
// thing, numbers compared as their text.
func TestCanonicalJSONDecodesAlike(t *testing.T) {
	t.Parallel()
	for _, v := range loadHashVectors(t) {
		if v.Canonical == nil {
			continue
		}
		a, errA := decodeJSONNumbers([]byte(*v.Canonical))
		b, errB := decodeJSONNumbers(v.body(t))
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

// TestCanonicalJSONDeepNesting checks that a body nested far beyond the limit
// is hashed raw without exhausting the stack: returning at all is the proof,
// the bound only keeps a regression from hanging the run.
func TestCanonicalJSONDeepNesting(t *testing.T) {
	t.Parallel()
	const depth = 200_000
	tests := []struct {
		name string
		body string
	}{
		{"arrays", strings.Repeat("[", depth) + strings.Repeat("]", depth)},
		{"arrays unclosed", strings.Repeat("[", depth)},
		{"objects", strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			done := make(chan string, 1)
			go func() {
				if _, ok := canonicalJSON([]byte(tt.body)); ok {
					t.Error("canonicalJSON accepted a body nested 200,000 deep")
				}
				done <- requestHash("POST", "/", "", []byte(tt.body))
			}()
			select {
			case h := <-done:
				c := canonicalizers.Get().(*canonicalizer)
				want := c.hashRequest("POST", "/", "", hashKindRaw, []byte(tt.body))
				c.release()
				if h != want {
					t.Errorf("requestHash = %s, want the raw hash %s", h, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("requestHash of a body nested 200,000 deep did not return")
			}
		})
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

// TestFoldAlikeNamesAreAnotherRequest: a handler decoding with
// encoding/json matches member names case-insensitively, last match wins,
// so {"qty":1,"QTY":1000} orders 1000 and {"QTY":1000,"qty":1} orders 1.
// The second sent under the first's key must get 422, not the first's
// replay; both used to canonicalise to one text and so one hash.
func TestFoldAlikeNamesAreAnotherRequest(t *testing.T) {
	t.Parallel()
	first, second := `{"qty":1,"QTY":1000}`, `{"QTY":1000,"qty":1}`
	var order struct{ Qty int }
	for body, want := range map[string]int{first: 1000, second: 1} {
		if err := json.Unmarshal([]byte(body), &order); err != nil || order.Qty != want {
			t.Fatalf("encoding/json decodes %s to qty %d (%v), the premise says %d", body, order.Qty, err, want)
		}
	}
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	if w := send(t, rt, "POST", "/orders", testKey, first); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := send(t, rt, "POST", "/orders", testKey, second)
	assertJSONError(t, w, http.StatusUnprocessableEntity, `{"error":"idempotency_key_body_mismatch"}`)
	if h.calls.Load() != 1 {
		t.Fatalf("calls = %d, want 1", h.calls.Load())
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
			c := canonicalizers.Get().(*canonicalizer)
			var ms []member
			for _, n := range names {
				start := len(c.keys)
				c.keys = append(c.keys, n...)
				ms = append(ms, member{keyStart: start, keyEnd: len(c.keys)})
			}
			got := c.foldsAlike(ms)
			c.release()
			if got != tt.want {
				t.Errorf("%+q and %+q among %d names: foldsAlike = %v, want %v", tt.a, tt.b, len(names), got, tt.want)
			}
		}
	}
}

// TestCanonicalJSONOwnsResult checks that canonicalJSON's result is not a
// pooled buffer a later call could overwrite.
func TestCanonicalJSONOwnsResult(t *testing.T) {
	t.Parallel()
	first, ok := canonicalJSON([]byte(`{"b":1,"a":2}`))
	if !ok {
		t.Fatal("canonicalJSON rejected a valid body")
	}
	for range 10 {
		canonicalJSON([]byte(`["xxxxxxxxxxxxxxxx"]`))
	}
	if string(first) != `{"a":2,"b":1}` {
		t.Errorf("canonicalJSON result changed to %q", first)
	}
}

// FuzzCanonicalJSON checks that canonicalJSON never panics, accepts only
// what encoding/json accepts, keeps the decoded value, and that its output is
// accepted and is its own canonical form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, v := range loadHashVectors(f) {
		// The deep-nesting vectors are kilobytes of brackets: as seeds they
		// slow every mutation and minimisation, and the depth limit has its
		// own tests.
		if body := v.body(f); len(body) <= 512 {
			f.Add(body)
		}
	}
	for _, s := range []string{`{"b":{"d":1,"c":2},"a":[3,{"f":4,"e":5}]}`, `"\u00e9\/"`, `-0.0e-0`, `[]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = requestHash("POST", "/", "", body) // never panics, JSON or not
		got, ok := canonicalJSON(body)
		if !json.Valid(body) {
			if ok {
				t.Fatalf("canonicalJSON accepted %q, which encoding/json rejects, as %q", body, got)
			}
			return
		}
		if !ok {
			return // valid JSON that is too deep, has names alike under case folding, bad UTF-8 or lone surrogates
		}
		again, ok := canonicalJSON(got)
		if !ok {
			t.Fatalf("canonicalJSON rejected its own output %q (from %q)", got, body)
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

// BenchmarkRequestHash measures the per-request cost of hashing a typical
// order body whose members are not yet in canonical order.
func BenchmarkRequestHash(b *testing.B) {
	body := []byte(`{"symbol":"AAPL","side":"buy","qty":10,"type":"limit","limit_price":"187.25",` +
		`"time_in_force":"day","account":"PA-0001234","note":"rebalance Q3 tech sleeve","extended_hours":false}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		requestHash("POST", "/api/trading/orders", "", body)
	}
}

// BenchmarkRequestHashSorted measures the same body already in canonical
// order, the path that moves no members.
func BenchmarkRequestHashSorted(b *testing.B) {
	body, ok := canonicalJSON([]byte(`{"symbol":"AAPL","side":"buy","qty":10,"type":"limit","limit_price":"187.25",` +
		`"time_in_force":"day","account":"PA-0001234","note":"rebalance Q3 tech sleeve","extended_hours":false}`))
	if !ok {
		b.Fatal("canonicalJSON rejected the benchmark body")
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		requestHash("POST", "/api/trading/orders", "", body)
	}
}
