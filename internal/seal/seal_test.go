package seal

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// testKey is a fixed key for id, so tests name keys by their ids.
func testKey(id string) []byte { return bytes.Repeat([]byte(id[:1]), KeySize) }

func ring(t *testing.T, ids ...string) *Keyring {
	t.Helper()
	var entries []string
	for _, id := range ids {
		entries = append(entries, id+":"+base64.StdEncoding.EncodeToString(testKey(id)))
	}
	k, err := Parse(strings.Join(entries, ","))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	testRow   = Row{ID: 42, Attempt: 2, Scope: "user-1", Endpoint: "POST /orders", Key: "0b3e1a5c-7a1f-4c1e-9f3d-2f6a8c9b1d20", RequestHash: strings.Repeat("ab", 32), Status: 201}
	testPlain = Plain{Kind: 1, Header: http.Header{"Content-Type": {"application/json"}, "Content-Language": {"en", "de"}},
		Body: []byte(`{"id":7,"amount":"1234.56"}`)}
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := New(ring(t, "k1"))
	for _, p := range []Plain{
		testPlain,
		{Kind: 2, Body: []byte{}},
		{Kind: 0, Header: http.Header{"Location": {"/orders/7"}}},
		{Kind: 2, Header: http.Header{"X-Empty": {}}, Body: bytes.Repeat([]byte{0, 0xff}, 70000)},
	} {
		id, sealed, err := s.Seal(ctx, testRow, p)
		if err != nil || id != "k1" {
			t.Fatalf("Seal: %q, %v", id, err)
		}
		if sealed[0] != Version || len(sealed) != len(appendEnvelope(nil, p))+overhead {
			t.Fatalf("sealed value: version %d, %d bytes", sealed[0], len(sealed))
		}
		if len(p.Body) > 8 && bytes.Contains(sealed, p.Body[:8]) {
			t.Fatal("the sealed value holds the body in plaintext")
		}
		got, err := s.Open(ctx, testRow, id, sealed)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if got.Kind != p.Kind || !bytes.Equal(got.Body, p.Body) || !reflect.DeepEqual(got.Header, p.Header) {
			t.Fatalf("opened %+v, want %+v", got, p)
		}
	}
}

// TestNoncesDiffer: sealing the same response twice gives two values (a
// fresh nonce each time).
func TestNoncesDiffer(t *testing.T) {
	t.Parallel()
	s := New(ring(t, "k1"))
	_, a, _ := s.Seal(t.Context(), testRow, testPlain)
	_, b, _ := s.Seal(t.Context(), testRow, testPlain)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one response are equal")
	}
}

// TestBoundToRow: a value opens only for the row, key id and status it
// was sealed for; changing any field of the additional data refuses it.
func TestBoundToRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	keys := ring(t, "k1", "k2")
	s := New(keys)
	_, sealed, err := s.Seal(ctx, testRow, testPlain)
	if err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(*Row){
		"id":           func(r *Row) { r.ID++ },
		"attempt":      func(r *Row) { r.Attempt++ },
		"scope":        func(r *Row) { r.Scope = "user-2" },
		"endpoint":     func(r *Row) { r.Endpoint = "POST /billing" },
		"key":          func(r *Row) { r.Key = "another" },
		"request hash": func(r *Row) { r.RequestHash = strings.Repeat("cd", 32) },
		"status":       func(r *Row) { r.Status = 200 },
		// Length prefixes: moving a byte from one field to the next is
		// another row.
		"shifted field": func(r *Row) { r.Scope, r.Endpoint = r.Scope+"P", strings.TrimPrefix(r.Endpoint, "P") },
	} {
		row := testRow
		change(&row)
		if _, err := s.Open(ctx, row, "k1", sealed); !errors.Is(err, ErrOpen) {
			t.Errorf("%s changed: Open = %v, want ErrOpen", name, err)
		}
	}
	// Another key id that exists: another key, and another additional data.
	if _, err := s.Open(ctx, testRow, "k2", sealed); !errors.Is(err, ErrOpen) {
		t.Errorf("another key id: Open = %v, want ErrOpen", err)
	}
}

func TestTamperingRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := New(ring(t, "k1"))
	_, sealed, _ := s.Seal(ctx, testRow, testPlain)
	for i := range sealed {
		for _, bit := range []byte{0x01, 0x80} {
			v := bytes.Clone(sealed)
			v[i] ^= bit
			if _, err := s.Open(ctx, testRow, "k1", v); !errors.Is(err, ErrOpen) {
				t.Fatalf("byte %d flipped (%#x): Open = %v, want ErrOpen", i, bit, err)
			}
		}
	}
	for _, n := range []int{0, 1, overhead - 1, len(sealed) - 1} {
		if _, err := s.Open(ctx, testRow, "k1", sealed[:n]); !errors.Is(err, ErrOpen) {
			t.Errorf("cut to %d bytes: Open = %v, want ErrOpen", n, err)
		}
	}
	if _, err := s.Open(ctx, testRow, "k1", append(bytes.Clone(sealed), 0)); !errors.Is(err, ErrOpen) {
		t.Errorf("a byte appended: Open = %v, want ErrOpen", err)
	}
}

// TestSameIDOtherKey: a key id whose key changed does not open what the
// old key sealed (the cache notices the new key).
func TestSameIDOtherKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, sealed, _ := New(ring(t, "k1")).Seal(ctx, testRow, testPlain)
	other, err := Parse("k1:" + base64.StdEncoding.EncodeToString(testKey("x")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(other).Open(ctx, testRow, "k1", sealed); !errors.Is(err, ErrOpen) {
		t.Fatalf("Open with another key under the same id = %v, want ErrOpen", err)
	}
}

func TestUnknownKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, sealed, _ := New(ring(t, "k1")).Seal(ctx, testRow, testPlain)
	_, err := New(ring(t, "k2")).Open(ctx, testRow, "k1", sealed)
	if !errors.Is(err, ErrKeySource) || !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("Open with an unknown key id = %v, want ErrKeySource, ErrUnknownKey, naming k1", err)
	}
}

// failingKeys is a key source that fails, or hands out a bad key.
type failingKeys struct{ key []byte }

func (f failingKeys) ActiveSealKey(context.Context) (string, []byte, error) {
	if f.key != nil {
		return "k1", f.key, nil
	}
	return "", nil, errors.New("kms: unreachable")
}

func (f failingKeys) SealKey(context.Context, string) ([]byte, error) {
	if f.key != nil {
		return f.key, nil
	}
	return nil, errors.New("kms: unreachable")
}

func TestKeySourceErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, sealed, _ := New(ring(t, "k1")).Seal(ctx, testRow, testPlain)
	for name, keys := range map[string]Keys{
		"failing":   failingKeys{},
		"short key": failingKeys{key: []byte("0123456789abcdef")},
	} {
		s := New(keys)
		if _, _, err := s.Seal(ctx, testRow, testPlain); !errors.Is(err, ErrKeySource) {
			t.Errorf("%s: Seal = %v, want ErrKeySource", name, err)
		}
		if _, err := s.Open(ctx, testRow, "k1", sealed); !errors.Is(err, ErrKeySource) {
			t.Errorf("%s: Open = %v, want ErrKeySource", name, err)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	k1, k2 := base64.StdEncoding.EncodeToString(testKey("a")), base64.StdEncoding.EncodeToString(testKey("b"))
	k, err := Parse(" k-1_A:" + k1 + " ,\nk2 : " + k2 + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if id, key, _ := k.ActiveSealKey(t.Context()); id != "k-1_A" || !bytes.Equal(key, testKey("a")) {
		t.Fatalf("active key %q", id)
	}
	if key, err := k.SealKey(t.Context(), "k2"); err != nil || !bytes.Equal(key, testKey("b")) {
		t.Fatalf("SealKey(k2): %v", err)
	}
	if got := fmt.Sprintf("%v %+v %#v %s", k, k, k, k); strings.Contains(got, k1) || strings.Contains(got, k2) || !strings.Contains(got, "k2") {
		t.Fatalf("printed keyring %q shows a key, or not its ids", got)
	}

	long := strings.Repeat("x", 33)
	secret := base64.StdEncoding.EncodeToString(testKey("s"))
	for _, tc := range []struct{ in, want string }{
		{"", "no keys"},
		{" , \n", "no keys"},
		{secret, "entry 1 has no ':'"},
		{"k1:" + k1 + "," + secret, "entry 2 has no ':'"},
		{"k1:" + k1 + ",k 2:" + k2, "entry 2: the ID is not"},
		{long + ":" + k1, "entry 1: the ID is not"},
		{":" + k1, "entry 1: the ID is not"},
		{"k1:" + k1 + ",k1:" + k2, `entry 2 (ID "k1"): the ID appears twice`},
		{"k1:" + base64.StdEncoding.EncodeToString(testKey("a")[:31]), `entry 1 (ID "k1"): the key is not`},
		{"k1:" + strings.TrimRight(k1, "="), `entry 1 (ID "k1"): the key is not`},
		{"k1:" + base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32)), `entry 1 (ID "k1"): the key is not`},
		{"k1:" + secret[:20] + "!" + secret[21:], `entry 1 (ID "k1"): the key is not`},
	} {
		_, err := Parse(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", tc.in, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), secret[:8]) || strings.Contains(err.Error(), k1[:8]) || strings.Contains(err.Error(), long) {
			t.Errorf("Parse(%q): error %q shows an entry's text", tc.in, err)
		}
	}
}

func TestEnvelopeMalformed(t *testing.T) {
	t.Parallel()
	good := appendEnvelope(nil, testPlain)
	if _, ok := parseEnvelope(good); !ok {
		t.Fatal("a good envelope does not parse")
	}
	for _, b := range [][]byte{
		nil,
		{1},                       // no header count
		{1, 3},                    // three headers, none there
		{1, 1, 5, 'a'},            // a name cut short
		{1, 1, 1, 'a', 200, 1},    // a count beyond the bytes
		{1, 1, 1, 'a', 1, 9, 'x'}, // a value cut short
	} {
		if _, ok := parseEnvelope(b); ok {
			t.Errorf("parseEnvelope(%v) accepted", b)
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	s := New(ring(&testing.T{}, "k1"))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.Seal(ctx, testRow, testPlain); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	s := New(ring(&testing.T{}, "k1"))
	ctx := context.Background()
	_, sealed, _ := s.Seal(ctx, testRow, testPlain)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Open(ctx, testRow, "k1", sealed); err != nil {
			b.Fatal(err)
		}
	}
}
