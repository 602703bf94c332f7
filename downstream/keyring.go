package downstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/internal/seal"
)

// Keyring is a fixed set of derive keys, the first active: what
// ParseKeys reads. It implements idempotency.DeriveKeys (give it to
// Config.DeriveKeys) and is safe for concurrent use.
//
// Rotation: put the new key first and keep the old ones after it. The
// first key is the one new claims store; the others are derive-only, for
// the rows that name them. A key may leave the keyring once no row names
// it (the rows' derive_key_id); until then, a row whose key is gone gets
// ErrKeyRetired from Key.
type Keyring struct{ k *seal.Keyring }

// ParseKeys parses derive keys as idempotency.ParseSealKeys parses seal
// keys: ID:KEY entries, comma- or line-separated, ID 1-32 characters of
// [A-Za-z0-9_-], KEY the standard base64 of 32 random bytes (openssl rand
// -base64 32), the first active. Errors name an entry by position and ID,
// never its text.
func ParseKeys(s string) (*Keyring, error) {
	k, err := seal.Parse(s)
	if err != nil {
		return nil, errors.New("downstream: derive keys: " + err.Error())
	}
	return &Keyring{k: k}, nil
}

// ActiveDeriveKey returns the active (first) key and its id. The key is
// shared: the caller must not change it.
func (k *Keyring) ActiveDeriveKey(ctx context.Context) (string, []byte, error) {
	return k.k.ActiveSealKey(ctx)
}

// DeriveKey returns the key of id, shared as ActiveDeriveKey's is; an
// error wrapping ErrKeyRetired when the keyring does not hold id.
func (k *Keyring) DeriveKey(ctx context.Context, id string) ([]byte, error) {
	key, err := k.k.SealKey(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: key id %q", ErrKeyRetired, id)
	}
	return key, nil
}

// IDs returns the key ids, the active one first.
func (k *Keyring) IDs() []string { return k.k.IDs() }

// String names the ids only, so printing a Keyring shows no key.
func (k *Keyring) String() string {
	ids := k.k.IDs()
	s := "derive keys"
	for i, id := range ids {
		if i > 0 {
			s += ","
		}
		s += " " + id
	}
	return s + " (active " + ids[0] + ")"
}

// GoString is String, for %#v.
func (k *Keyring) GoString() string { return k.String() }
