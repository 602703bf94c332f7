package downstream

import (
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Profile is the form a downstream accepts its ids in. A custom profile
// is one struct literal; Validate says whether it can work.
//
// The id is Prefix followed by digits over Alphabet: the HMAC-SHA256,
// read as a big-endian integer H, gives the first digits of H / 2^256 in
// base len(Alphabet) (the first digit over First when set), as many as
// MaxLength leaves after Prefix, or as 256 bits need when fewer do. Bits
// says how much of the HMAC an id keeps. With UUID set, the id is Prefix
// and an RFC 9562 version-8 UUID instead.
type Profile struct {
	Name      string // names the profile in errors
	MaxLength int    // the longest id the downstream accepts, Prefix included
	Alphabet  string // the digits, in order: distinct printable ASCII characters, not space
	First     string // when set, the first digit's characters instead of Alphabet's (Digits: no leading 0)
	Prefix    string // printable ASCII put before every id
	UUID      bool   // an RFC 9562 version-8 UUID, lower-case 8-4-4-4-12 (Alphabet and First unset): 122 bits
}

// alnum is the case-sensitive alphanumeric alphabet.
const alnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// The shipped profiles. Each cites where its format comes from
// (DOWNSTREAM-SOURCES.md in the design notes; docs/derived-keys.md) and
// states the bits of the HMAC its ids keep.
var (
	// UUID is a version-8 UUID (RFC 9562, variant 10), lower-case
	// 8-4-4-4-12, 36 characters: 122 bits. For a downstream that wants a
	// UUID (Helcim's 36-character keys, a generic "UUID" idempotency key).
	UUID = Profile{Name: "uuid", MaxLength: 36, UUID: true}
	// Alpaca is Alpaca's client_order_id: 43 case-sensitive alphanumeric
	// characters, 256 bits. The venue deduplicates on this id
	// (bennycode/trading-signals PR #1178); its limit of 128 characters is
	// not confirmed from Alpaca's own pages, and 43 fit well below it.
	Alpaca = Profile{Name: "alpaca", MaxLength: 128, Alphabet: alnum}
	// Binance is Binance spot's newClientOrderId,
	// ^[\.A-Z\:/a-z0-9_-]{1,36}$ (Binance spot API docs): 36 characters
	// of [0-9A-Za-z_-], 216 bits.
	Binance = Profile{Name: "binance", MaxLength: 36, Alphabet: alnum + "-_"}
	// OKX is OKX's clOrdId, 1-32 case-sensitive alphanumeric characters
	// (OKX v5 docs, as quoted in nautilus_trader's OKX_MAX_CLORDID_LEN): 32
	// characters, 190 bits.
	OKX = Profile{Name: "okx", MaxLength: 32, Alphabet: alnum}
	// Stripe is Stripe's Idempotency-Key, up to 255 characters (Stripe's
	// API docs; v2 keeps keys 30 days): 43 case-sensitive alphanumeric
	// characters, 256 bits.
	Stripe = Profile{Name: "stripe", MaxLength: 255, Alphabet: alnum}
	// Digits is 18 decimal digits, the first not 0 (a value in
	// [10^17, 10^18), so a downstream that parses it as an integer keeps
	// every digit): about 59.6 bits, BELOW 128. Use it only for a
	// downstream that scopes its ids per account, where a collision needs
	// two of one account's keys to meet.
	Digits = Profile{Name: "digits", MaxLength: 18, Alphabet: "0123456789", First: "123456789"}
)

// minBits is the fewest bits a profile may keep: below it, the ids of
// different keys would meet too often to tell orders apart.
const minBits = 48

// uuidLength is the length of a UUID's text.
const uuidLength = 36

// Validate returns nil for a profile that can derive ids, else an error
// saying why not: no room for a digit after Prefix, an alphabet of fewer
// than 2 characters, a character twice or not printable ASCII, a UUID
// profile with an alphabet or without room for the UUID, or fewer than 48
// bits kept.
func (p Profile) Validate() error {
	fail := func(why string) error { return fmt.Errorf("downstream: profile %q: %s", p.Name, why) }
	if !printable(p.Prefix) {
		return fail("the prefix is not printable ASCII")
	}
	if p.UUID {
		if p.Alphabet != "" || p.First != "" {
			return fail("a UUID profile has no alphabet")
		}
		if p.MaxLength < len(p.Prefix)+uuidLength {
			return fail(fmt.Sprintf("MaxLength %d has no room for the prefix and a 36-character UUID", p.MaxLength))
		}
		return nil
	}
	switch {
	case len(p.Alphabet) < 2:
		return fail("the alphabet has fewer than 2 characters")
	case !printable(p.Alphabet) || !distinct(p.Alphabet):
		return fail("the alphabet is not distinct printable ASCII characters (no space)")
	case p.First != "" && (!printable(p.First) || !distinct(p.First)):
		return fail("First is not distinct printable ASCII characters (no space)")
	case p.MaxLength-len(p.Prefix) < 1:
		return fail(fmt.Sprintf("MaxLength %d leaves no room for a digit after the %d-character prefix", p.MaxLength, len(p.Prefix)))
	case p.Bits() < minBits:
		return fail(fmt.Sprintf("its ids keep %.1f bits, fewer than %d: ids of different keys would meet", p.Bits(), minBits))
	}
	return nil
}

// Bits returns how many bits of the HMAC the profile's ids keep: 122 for
// a UUID, else log2 of the number of distinct ids, at most 256.
func (p Profile) Bits() float64 {
	if p.UUID {
		return 122
	}
	return p.bits(p.digits())
}

// Length returns the length of the profile's ids, Prefix included.
func (p Profile) Length() int {
	if p.UUID {
		return len(p.Prefix) + uuidLength
	}
	return len(p.Prefix) + p.digits()
}

// bits is log2 of the number of ids of n digits.
func (p Profile) bits(n int) float64 {
	if n < 1 || len(p.Alphabet) < 2 {
		return 0
	}
	return min(256, math.Log2(float64(len(p.first())))+float64(n-1)*math.Log2(float64(len(p.Alphabet))))
}

// digits is how many digits follow Prefix: as many as MaxLength leaves,
// or as 256 bits need when fewer do.
func (p Profile) digits() int {
	room := p.MaxLength - len(p.Prefix)
	n := 1
	for n < room && p.bits(n) < 256 {
		n++
	}
	return min(n, max(room, 0))
}

// first is the first digit's alphabet.
func (p Profile) first() string {
	if p.First != "" {
		return p.First
	}
	return p.Alphabet
}

// format returns the id of mac (32 bytes) in p's form. p is valid.
func (p Profile) format(mac []byte) string {
	if p.UUID {
		return p.Prefix + formatUUID(mac)
	}
	n := p.digits()
	base := big.NewInt(int64(len(p.Alphabet)))
	// count is the number of ids: len(first) * len(Alphabet)^(n-1).
	count := new(big.Int).Exp(base, big.NewInt(int64(n-1)), nil)
	count.Mul(count, big.NewInt(int64(len(p.first()))))
	// v = floor(H * count / 2^256): the first n digits of H / 2^256.
	v := new(big.Int).SetBytes(mac)
	v.Mul(v, count).Rsh(v, 256)
	out := make([]byte, n)
	d := new(big.Int)
	for i := n - 1; i > 0; i-- {
		v.DivMod(v, base, d)
		out[i] = p.Alphabet[d.Int64()]
	}
	out[0] = p.first()[v.Int64()]
	return p.Prefix + string(out)
}

// formatUUID returns the version-8 UUID of mac's first 16 bytes.
func formatUUID(mac []byte) string {
	var u [16]byte
	copy(u[:], mac)
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10
	h := hex.EncodeToString(u[:])
	return strings.Join([]string{h[:8], h[8:12], h[12:16], h[16:20], h[20:]}, "-")
}

// printable reports a string of printable ASCII characters other than
// space.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// distinct reports a string whose bytes differ.
func distinct(s string) bool {
	var seen [256]bool
	for i := 0; i < len(s); i++ {
		if seen[s[i]] {
			return false
		}
		seen[s[i]] = true
	}
	return true
}
