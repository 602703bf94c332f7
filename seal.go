package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/internal/seal"
)

// SealKeys gives a sealing store (NewSealingStore) its AES-256 keys, 32
// bytes each, by id (1-32 characters of [A-Za-z0-9_-]): the active key
// seals, every key opens. A KMS or Vault implements it over its data keys
// (cached: it is asked once per record and once per opened value). It must
// be safe for concurrent use and keep key material out of its errors.
type SealKeys interface {
	// ActiveSealKey returns the key that seals new responses, and its id.
	ActiveSealKey(ctx context.Context) (id string, key []byte, err error)
	// SealKey returns the key of id; an error when it has none.
	SealKey(ctx context.Context, id string) (key []byte, err error)
}

// ParseSealKeys parses the format of IDEMPOTENCY_SEAL_KEYS: ID:KEY entries
// separated by commas or lines, KEY the standard base64 of 32 random bytes,
// the first active. An error names a bad entry by position and ID, never
// by its text.
func ParseSealKeys(s string) (SealKeys, error) {
	k, err := seal.Parse(s)
	if err != nil {
		return nil, errors.New("idempotency: seal keys: " + err.Error())
	}
	return k, nil
}

// NewSealingStore returns inner sealing each recorded response (body and
// headers, AES-256-GCM under keys' active key), bound to its row (id,
// attempt, scope, endpoint, key, request hash, status), and opening it when
// read. A sealed row that does not open, whatever store reads it, answers
// 503 on every policy (ReasonUnseal), never a replay or a second run; a row
// recorded before sealing replays as it is. A response that cannot be
// sealed is a record failure (ReasonSeal). The result has exactly inner's
// optional interfaces (TxStore, OwnerReleaser, KeyReleaser, Check). It
// fails unless keys gives an active key under ctx. See the README,
// "Sealing stored responses".
func NewSealingStore(ctx context.Context, inner Store, keys SealKeys) (Store, error) {
	if inner == nil || keys == nil {
		return nil, errors.New("idempotency: NewSealingStore: inner store and keys must not be nil")
	}
	w := &sealingStore{inner: inner, sealer: seal.New(keys)}
	if _, _, err := w.sealer.Seal(ctx, seal.Row{}, seal.Plain{}); err != nil {
		return nil, fmt.Errorf("idempotency: NewSealingStore: %w", err)
	}
	return w.withInterfaces(), nil
}
