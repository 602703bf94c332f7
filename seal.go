package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/internal/seal"
)

// SealKeys gives NewSealingStore its 32-byte keys by id (1-32 of
// [A-Za-z0-9_-]): the active one seals, every one opens. It must be safe for
// concurrent use and keep key material out of its errors (a KMS caches).
type SealKeys interface {
	// ActiveSealKey returns the key that seals new responses, and its id.
	ActiveSealKey(ctx context.Context) (id string, key []byte, err error)
	// SealKey returns the key of id; an error when it has none.
	SealKey(ctx context.Context, id string) (key []byte, err error)
}

// ParseSealKeys parses IDEMPOTENCY_SEAL_KEYS: ID:KEY entries, comma- or
// line-separated, KEY the standard base64 of 32 random bytes, the first
// active. Errors name an entry by position and ID, never its text.
func ParseSealKeys(s string) (SealKeys, error) {
	k, err := seal.Parse(s)
	if err != nil {
		return nil, errors.New("idempotency: seal keys: " + err.Error())
	}
	return k, nil
}

// NewSealingStore returns inner sealing each recorded response (body and
// headers, AES-256-GCM, bound to its row) and opening it when read. A row
// that does not open answers 503 (ReasonUnseal); plaintext replays as it
// is; a failed seal is a record failure (ReasonSeal). It is a TxStore
// exactly when inner is, and fails unless keys gives an active key.
func NewSealingStore(ctx context.Context, inner Store, keys SealKeys) (Store, error) {
	if inner == nil || keys == nil {
		return nil, errors.New("idempotency: NewSealingStore: inner store and keys must not be nil")
	}
	w := &sealingStore{inner: inner, sealer: seal.New(keys)}
	if _, _, err := w.sealer.Seal(ctx, seal.Row{}, seal.Plain{}); err != nil {
		return nil, fmt.Errorf("idempotency: NewSealingStore: %w", err)
	}
	return w.variant(), nil
}
