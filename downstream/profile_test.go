package downstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// shipped are the shipped profiles with the format their downstream
// documents (DOWNSTREAM-SOURCES.md), the length of their ids and the bits
// their doc comments state.
var shipped = []struct {
	p      Profile
	format *regexp.Regexp // the downstream's own format
	length int
	bits   float64
}{
	{UUID, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), 36, 122},
	{Alpaca, regexp.MustCompile(`^.{1,128}$`), 43, 256},
	{Binance, regexp.MustCompile(`^[\.A-Z\:/a-z0-9_-]{1,36}$`), 36, 216},
	{OKX, regexp.MustCompile(`^[A-Za-z0-9]{1,32}$`), 32, 32 * math.Log2(62)},
	{Stripe, regexp.MustCompile(`^.{1,255}$`), 43, 256},
	{Digits, regexp.MustCompile(`^[1-9][0-9]{17}$`), 18, math.Log2(9e17)},
}

// TestShippedProfiles: every shipped profile is valid, its ids have the
// stated length and keep the stated bits (at least 128 but for a UUID,
// whose form leaves 122, and Digits, which says it keeps fewer).
func TestShippedProfiles(t *testing.T) {
	for _, s := range shipped {
		if err := s.p.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", s.p.Name, err)
		}
		if got := s.p.Length(); got != s.length || got > s.p.MaxLength {
			t.Errorf("%s: Length %d, want %d (MaxLength %d)", s.p.Name, got, s.length, s.p.MaxLength)
		}
		if got := s.p.Bits(); math.Abs(got-s.bits) > 0.01 {
			t.Errorf("%s: Bits %.2f, want %.2f", s.p.Name, got, s.bits)
		}
		if s.p.Bits() < 128 && s.p.Name != "digits" && s.p.Name != "uuid" { // a valid UUID has 122 free bits
			t.Errorf("%s keeps %.1f bits, under 128", s.p.Name, s.p.Bits())
		}
	}
	if b := Digits.Bits(); b < 59.6 || b > 59.7 {
		t.Errorf("Digits keeps %.2f bits; its doc says about 59.6", b)
	}
}

// FuzzProfiles: for any identity, every shipped profile's id matches its
// downstream's format and has its length; a UUID parses as version 8 of
// RFC 9562's variant, and a Digits id is an integer in [10^17, 10^18).
func FuzzProfiles(f *testing.F) {
	f.Add("", "", "", "", "", "")
	f.Add("user-1", "POST /orders", "0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b", "broker", "entry", "A")
	f.Add("\x00", "\xff", strings.Repeat("k", 255), "ü", "hedge-2", "key_2")
	keys := testKeyring(f, "A", "key_2")
	f.Fuzz(func(t *testing.T, scope, endpoint, key, name, leg, keyID string) {
		if keyID != "key_2" {
			keyID = "A"
		}
		mac, err := sum(context.Background(), idempotency.Derivation{KeyID: keyID, Scope: scope, Endpoint: endpoint, Key: key, Keys: keys}, name, leg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range shipped {
			id := s.p.format(mac)
			if !s.format.MatchString(id) || len(id) != s.length {
				t.Fatalf("%s: id %q (%d characters) does not match %s with %d characters", s.p.Name, id, len(id), s.format, s.length)
			}
			if s.p.UUID {
				u, err := uuid.Parse(id)
				if err != nil || u.Version() != 8 || u.Variant() != uuid.RFC4122 || u.String() != id {
					t.Fatalf("uuid: %q is not a lower-case version-8 RFC 9562 UUID (%v)", id, err)
				}
			}
			if s.p.Name == "digits" {
				v, ok := new(big.Int).SetString(id, 10)
				if !ok || v.Cmp(big.NewInt(1e17)) < 0 || v.Cmp(big.NewInt(1e18)) >= 0 {
					t.Fatalf("digits: %q is not an integer in [10^17, 10^18)", id)
				}
			}
		}
	})
}

// TestFormatKeepsTheFirstDigits: an id is the first digits of H / 2^256
// in the profile's base (H the HMAC as a big-endian integer): decoded, its
// value v satisfies v * 2^256 <= H * count < (v+1) * 2^256, count being
// the number of ids; so it keeps the bits Bits states.
func TestFormatKeepsTheFirstDigits(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	custom := Profile{Name: "custom", MaxLength: 20, Alphabet: "abcdefghijklmnopqrstuvwxyz", First: "xyz", Prefix: "ord-"}
	for _, p := range append([]Profile{custom}, Alpaca, Binance, OKX, Stripe, Digits) {
		for range 200 {
			mac := make([]byte, sha256.Size)
			for i := range mac {
				mac[i] = byte(r.Uint32())
			}
			id := p.format(mac)
			if !strings.HasPrefix(id, p.Prefix) {
				t.Fatalf("%s: %q lacks the prefix %q", p.Name, id, p.Prefix)
			}
			digits := id[len(p.Prefix):]
			v := big.NewInt(int64(strings.IndexByte(p.first(), digits[0])))
			base := big.NewInt(int64(len(p.Alphabet)))
			count := big.NewInt(int64(len(p.first())))
			for i := 1; i < len(digits); i++ {
				v.Mul(v, base).Add(v, big.NewInt(int64(strings.IndexByte(p.Alphabet, digits[i]))))
				count.Mul(count, base)
			}
			if got := float64(count.BitLen()); math.Abs(min(got, 257)-math.Ceil(p.Bits())) > 1 {
				t.Fatalf("%s: %d ids, %.1f bits stated", p.Name, count, p.Bits())
			}
			hc := new(big.Int).Mul(new(big.Int).SetBytes(mac), count)
			lo := new(big.Int).Lsh(v, 256)
			hi := new(big.Int).Lsh(new(big.Int).Add(v, big.NewInt(1)), 256)
			if hc.Cmp(lo) < 0 || hc.Cmp(hi) >= 0 {
				t.Fatalf("%s: id %q is not the first %d digits of the HMAC", p.Name, id, len(digits))
			}
		}
	}
}

// TestFormatSpreadsEvenly: the ids of a small profile (5 digits, the
// first 1-9: 90,000 ids) reached by 200,000 random HMACs number what a
// uniform draw reaches (90,000 * (1 - e^(-200000/90000)), about 80,300),
// and every character shows at every position of every shipped profile:
// no digit of an id is stuck or starved, so an id keeps its stated bits.
func TestFormatSpreadsEvenly(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	mac := make([]byte, sha256.Size)
	fill := func() {
		for i := range mac {
			mac[i] = byte(r.Uint32())
		}
	}
	small := Profile{Name: "small", MaxLength: 5, Alphabet: "0123456789", First: "123456789"}
	seen := make(map[string]bool)
	const draws = 200_000
	for range draws {
		fill()
		seen[small.format(mac)] = true
	}
	want := 90_000 * (1 - math.Exp(-draws/90_000.0))
	if n := float64(len(seen)); n < 0.98*want || n > 1.02*want {
		t.Errorf("%d distinct ids of %d draws over 90,000, want about %.0f", len(seen), draws, want)
	}
	for _, s := range shipped {
		if s.p.UUID {
			continue
		}
		at := make([]map[byte]bool, s.length)
		for i := range at {
			at[i] = make(map[byte]bool)
		}
		for range 5000 {
			fill()
			id := s.p.format(mac)
			for i := range id {
				at[i][id[i]] = true
			}
		}
		for i, chars := range at {
			want := len(s.p.Alphabet)
			if i == 0 {
				want = len(s.p.first())
			}
			if len(chars) != want {
				t.Errorf("%s: position %d shows %d of its %d characters in 5,000 ids", s.p.Name, i, len(chars), want)
			}
		}
	}
}

// TestValidateRefuses: a profile that cannot work is refused with a
// reason, and Key refuses it before deriving anything.
func TestValidateRefuses(t *testing.T) {
	for _, tc := range []struct {
		p    Profile
		want string
	}{
		{Profile{Name: "none"}, "fewer than 2"},
		{Profile{MaxLength: 10, Alphabet: "a"}, "fewer than 2"},
		{Profile{MaxLength: 10, Alphabet: "aba"}, "distinct"},
		{Profile{MaxLength: 10, Alphabet: "a b"}, "distinct"},
		{Profile{MaxLength: 10, Alphabet: "abé"}, "distinct"},
		{Profile{MaxLength: 40, Alphabet: alnum, First: "xx"}, "First"},
		{Profile{MaxLength: 4, Alphabet: alnum, Prefix: "ord-"}, "no room"},
		{Profile{MaxLength: 40, Alphabet: alnum, Prefix: "a b"}, "prefix"},
		{Profile{MaxLength: 6, Alphabet: alnum}, "bits"},
		{Profile{MaxLength: 36, UUID: true, Prefix: "x"}, "no room"},
		{Profile{MaxLength: 36, UUID: true, Alphabet: alnum}, "no alphabet"},
	} {
		err := tc.p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want an error saying %q", tc.p, err, tc.want)
		}
		if _, kerr := Key(context.Background(), "broker", "", tc.p); kerr == nil || errors.Is(kerr, ErrNoKey) {
			t.Errorf("%+v: Key = %v, want the profile refused first", tc.p, kerr)
		}
	}
	if err := (Profile{Name: "ok", MaxLength: 41, UUID: true, Prefix: "ord-"}).Validate(); err != nil {
		t.Errorf("a prefixed UUID profile with room: %v", err)
	}
}

// TestInputIsLengthPrefixed: fields that run together differently give
// different HMAC inputs, so ("ab", "c") and ("a", "bc") never share an id.
func TestInputIsLengthPrefixed(t *testing.T) {
	d := idempotency.Derivation{KeyID: "A", Scope: "u", Endpoint: "e", Key: "k"}
	if bytes.Equal(input(d, "ab", "c"), input(d, "a", "bc")) {
		t.Error("input(ab, c) = input(a, bc)")
	}
	d2 := d
	d2.Scope, d2.Endpoint = "ue", ""
	if bytes.Equal(input(d, "n", "l"), input(d2, "n", "l")) {
		t.Error("scope u, endpoint e gives the input of scope ue, endpoint \"\"")
	}
	want := []byte{0, 0, 0, 1, formatVersion, 0, 0, 0, 1, 'A', 0, 0, 0, 1, 'u', 0, 0, 0, 1, 'e', 0, 0, 0, 1, 'k', 0, 0, 0, 1, 'n', 0, 0, 0, 0}
	if got := input(d, "n", ""); !bytes.Equal(got, want) {
		t.Errorf("input = %v, want %v (the documented layout)", got, want)
	}
}

// TestKeyringKeepsItsKeysSecret: ParseKeys' errors and a Keyring's text
// never show key material; an id it does not hold is ErrKeyRetired.
func TestKeyringKeepsItsKeysSecret(t *testing.T) {
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for _, bad := range []string{"", "A" + secret, "A:" + secret[:20], "A:" + secret + ",A:" + secret, "a b:" + secret} {
		_, err := ParseKeys(bad)
		if err == nil {
			t.Errorf("ParseKeys(%q) = nil error", bad)
			continue
		}
		if strings.Contains(err.Error(), secret[:20]) {
			t.Errorf("ParseKeys error shows key material: %v", err)
		}
	}
	k, err := ParseKeys("B:" + secret + ",\nA:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	if id, _, _ := k.ActiveDeriveKey(context.Background()); id != "B" {
		t.Errorf("active key %q, want the first, B", id)
	}
	if _, err := k.DeriveKey(context.Background(), "A"); err != nil {
		t.Errorf("derive-only key A: %v", err)
	}
	if _, err := k.DeriveKey(context.Background(), "C"); !errors.Is(err, ErrKeyRetired) {
		t.Errorf("DeriveKey of an id it lacks: %v, want ErrKeyRetired", err)
	}
	for _, s := range []string{k.String(), k.GoString()} {
		if strings.Contains(s, secret[:20]) || !strings.Contains(s, "active B") {
			t.Errorf("Keyring text %q", s)
		}
	}
}

// testKeyring returns a keyring of ids, each with a key of its own, the
// first active.
func testKeyring(tb testing.TB, ids ...string) *Keyring {
	tb.Helper()
	var entries []string
	for _, id := range ids {
		k := sha256.Sum256([]byte("derive key " + id))
		entries = append(entries, id+":"+base64.StdEncoding.EncodeToString(k[:]))
	}
	k, err := ParseKeys(strings.Join(entries, ","))
	if err != nil {
		tb.Fatal(err)
	}
	return k
}
