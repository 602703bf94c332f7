package seal

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Keyring is a fixed set of keys, the first one active: what
// IDEMPOTENCY_SEAL_KEYS and a keys file hold. It is read-only once parsed,
// so it is safe for concurrent use.
type Keyring struct {
	ids  []string // in the order given; ids[0] is the active key
	keys map[string][]byte
}

// ErrUnknownKey is returned (wrapped, with the id) by Keyring.SealKey for
// an id it does not hold.
var ErrUnknownKey = errors.New("no key with this id")

// Parse parses a comma-separated list of ID:KEY entries (a file may put
// them on lines of their own): ID 1-32 characters of [A-Za-z0-9_-], KEY
// the standard base64 (padded) of 32 bytes; white space around entries and
// their parts, and empty entries, are ignored. The first entry is the
// active key. An error names the entry by its position
// (1 for the first) and, when the ID is well formed, by its ID: never by
// its text, which holds the key.
func Parse(text string) (*Keyring, error) {
	k := &Keyring{keys: make(map[string][]byte)}
	var entries []string
	for _, e := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == '\n' }) {
		if e = strings.TrimSpace(e); e != "" {
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		return nil, errors.New("no keys: want ID:KEY entries, comma-separated, the first the active key")
	}
	for i, e := range entries {
		pos := i + 1
		id, key, found := strings.Cut(e, ":")
		id, key = strings.TrimSpace(id), strings.TrimSpace(key)
		switch {
		case !found:
			return nil, fmt.Errorf("entry %d has no ':' between its ID and its key", pos)
		case !ValidID(id):
			return nil, fmt.Errorf("entry %d: the ID is not 1-32 characters of A-Z, a-z, 0-9, '_' and '-'", pos)
		case k.keys[id] != nil:
			return nil, fmt.Errorf("entry %d (ID %q): the ID appears twice", pos, id)
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(key)
		if err != nil || len(raw) != KeySize {
			return nil, fmt.Errorf("entry %d (ID %q): the key is not the standard base64 of %d bytes (e.g. openssl rand -base64 32)", pos, id, KeySize)
		}
		k.ids = append(k.ids, id)
		k.keys[id] = raw
	}
	return k, nil
}

// ValidID reports an id of 1-32 characters of [A-Za-z0-9_-].
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 32 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// ActiveSealKey returns the first key and its id. The key is shared: the
// caller must not change it.
func (k *Keyring) ActiveSealKey(context.Context) (string, []byte, error) {
	return k.ids[0], k.keys[k.ids[0]], nil
}

// SealKey returns the key of id, shared as ActiveSealKey's is.
func (k *Keyring) SealKey(_ context.Context, id string) ([]byte, error) {
	if key := k.keys[id]; key != nil {
		return key, nil
	}
	return nil, ErrUnknownKey
}

// IDs returns the key ids, the active one first.
func (k *Keyring) IDs() []string { return append([]string(nil), k.ids...) }

// String names the ids only, so printing a Keyring shows no key.
func (k *Keyring) String() string {
	return "seal keys " + strings.Join(k.ids, ", ") + " (active " + k.ids[0] + ")"
}

// GoString is String, for %#v.
func (k *Keyring) GoString() string { return k.String() }
