// Package downstream derives the ids a handler sends to the systems it
// calls (a broker's client_order_id, a payment provider's
// Idempotency-Key) from the call's idempotency key: the same id on every
// retry and every takeover of the key, so a downstream that deduplicates
// by it books the order once however often the call runs.
//
// Inside an HTTP handler, a Do function, or a gRPC or Connect method
// wrapped by the middleware, Key returns the id for a named downstream
// and a leg:
//
//	id, err := downstream.Key(ctx, "broker", "entry", downstream.Alpaca)
//
// The id is HMAC-SHA256, under a key of Config.DeriveKeys (a Keyring), of
// the row's derive key id, user scope, endpoint, idempotency key, the
// downstream's name and the leg, formatted by a Profile. It never depends
// on the attempt, the owner or the time. The row names the key it was
// first claimed under (its derive_key_id), and every derivation for it
// uses that key, so rotating the keyring never changes an id a retry
// sends while the key's row exists. A released key (its row deleted: a
// Retryable outcome, ReleaseOnError, NoStore, a reconcile's not-done) is
// claimed again under the key active then: release only a call that did
// not reach the downstream. docs/derived-keys.md describes the profiles
// and their sources.
package downstream

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency"
)

// ErrNoKey is returned by Key for a call without an idempotency key (an
// optional-key route called without one, the kill-switch off), or outside
// a wrapped handler: there is nothing to derive from. Send no id, or a
// random one: the downstream call is then not idempotent, as the request
// is not.
var ErrNoKey = errors.New("downstream: the call has no idempotency key to derive from")

// ErrKeyRetired is returned (wrapped) by Key when the keyring no longer
// holds the key the call's row was claimed under, or the row names none
// (claimed without Config.DeriveKeys). The handler must not call the
// downstream: an id derived under another key would be a new order.
var ErrKeyRetired = errors.New("downstream: the row's derive key is not in the keyring")

// ErrNoKeyring is returned by Key when Config.DeriveKeys is not set.
var ErrNoKeyring = errors.New("downstream: no derive keys: set idempotency.Config.DeriveKeys")

// formatVersion is the first field of the HMAC's input: a change of the
// input's layout is a new version.
const formatVersion = 1

// Key returns the id to send to the downstream system name for the leg
// leg of the call ctx belongs to, formatted by p: the same for every
// retry and takeover of the call's key while its row exists (a released
// key is claimed again under the active key; see the package doc). It
// fails with ErrNoKey where there is no key, ErrKeyRetired (wrapped) where
// the row's key is gone, ErrNoKeyring without Config.DeriveKeys, and an
// error for an empty name or a profile Validate refuses. leg may be "" for
// a call's only leg.
func Key(ctx context.Context, name, leg string, p Profile) (string, error) {
	if name == "" {
		return "", errors.New("downstream: Key: the downstream's name is empty")
	}
	if err := p.Validate(); err != nil {
		return "", err
	}
	d, ok := idempotency.DerivationFromContext(ctx)
	if !ok {
		if _, keyed := idempotency.KeyFromContext(ctx); keyed {
			return "", ErrNoKeyring
		}
		return "", ErrNoKey
	}
	mac, err := sum(ctx, d, name, leg)
	if err != nil {
		return "", err
	}
	return p.format(mac), nil
}

// sum returns the HMAC-SHA256 of d, name and leg under the key d names.
func sum(ctx context.Context, d idempotency.Derivation, name, leg string) ([]byte, error) {
	if d.Keys == nil {
		return nil, ErrNoKeyring
	}
	if d.KeyID == "" {
		return nil, fmt.Errorf("%w: the call's row names no derive key (claimed without Config.DeriveKeys, or its active key failed)", ErrKeyRetired)
	}
	key, err := d.Keys.DeriveKey(ctx, d.KeyID)
	if err != nil {
		if errors.Is(err, ErrKeyRetired) {
			return nil, err
		}
		return nil, fmt.Errorf("downstream: derive key %q: %w", d.KeyID, err)
	}
	h := hmac.New(sha256.New, key)
	h.Write(input(d, name, leg))
	return h.Sum(nil), nil
}

// input is the HMAC's input: the format version, derive key id, scope,
// endpoint, key, downstream name and leg, each prefixed with its length
// as a 4-byte big-endian integer (the version is one byte), so no two
// identities share an input and any language can build it.
func input(d idempotency.Derivation, name, leg string) []byte {
	b := append(binary.BigEndian.AppendUint32(nil, 1), formatVersion)
	for _, s := range []string{d.KeyID, d.Scope, d.Endpoint, d.Key, name, leg} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}
