// Package seal seals recorded responses at rest (DESIGN.md "Sealed at
// rest"): AES-256-GCM with a fresh random 96-bit nonce per value, additional
// data that binds a sealed value to its row, and the envelope that carries
// the body kind, the stored headers and the body. The root package's
// sealing store and the CLI's reseal both use it, so both write one format.
//
// Nothing here puts key material into an error or a string.
package seal

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// Version is the format version: the first byte of every sealed value and
// the first field of its additional data.
const Version byte = 1

// KeySize is the size of an AES-256 key.
const KeySize = 32

// overhead is what sealing adds to the envelope: the version byte, the
// nonce (12) and the tag (16).
const overhead = 1 + 12 + 16

// Keys is a key source: idempotency.SealKeys has the same methods.
type Keys interface {
	ActiveSealKey(ctx context.Context) (id string, key []byte, err error)
	SealKey(ctx context.Context, id string) (key []byte, err error)
}

// Row is what a sealed value is bound to: the row, the ownership that
// recorded it, and the response's status.
type Row struct {
	ID          int64
	Attempt     int32
	Scope       string
	Endpoint    string
	Key         string
	RequestHash string
	Status      int
}

// Plain is a response before sealing and after opening. Kind is the root
// package's BodyKind.
type Plain struct {
	Kind   uint8
	Header http.Header
	Body   []byte
}

// Errors of Open and Seal. None carries key material.
var (
	// ErrOpen: the value is not one this format and these keys produce
	// for this row (tampered, copied from another row, truncated, or
	// sealed with another key under the same id).
	ErrOpen = errors.New("the sealed value does not open (tampered, copied from another row, or another key)")
	// ErrKeySource: the key source failed or had no usable key.
	ErrKeySource = errors.New("the seal key source failed")
)

// Sealer seals and opens values with the keys of one key source, caching
// one AEAD per key id. It is safe for concurrent use.
type Sealer struct {
	keys Keys

	mu    sync.RWMutex
	aeads map[string]*cachedAEAD
}

type cachedAEAD struct {
	key  [KeySize]byte // to notice a source that changed the key of an id
	aead cipher.AEAD
}

// New returns a Sealer over keys.
func New(keys Keys) *Sealer {
	return &Sealer{keys: keys, aeads: make(map[string]*cachedAEAD)}
}

// Seal seals p for row with the active key and returns the key's id and
// the sealed value.
func (s *Sealer) Seal(ctx context.Context, row Row, p Plain) (id string, sealed []byte, err error) {
	id, key, err := s.keys.ActiveSealKey(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("%w: active key: %w", ErrKeySource, err)
	}
	if !ValidID(id) {
		return "", nil, fmt.Errorf("%w: the active key's id is not 1-32 characters of [A-Za-z0-9_-]", ErrKeySource)
	}
	aead, err := s.aead(id, key)
	if err != nil {
		return "", nil, err
	}
	pt := appendEnvelope(nil, p)
	out := make([]byte, 1, len(pt)+overhead)
	out[0] = Version
	return id, aead.Seal(out, nil, pt, additionalData(Version, id, row)), nil
}

// Open opens the value sealed for row with the key id.
func (s *Sealer) Open(ctx context.Context, row Row, id string, sealed []byte) (Plain, error) {
	if len(sealed) < overhead || sealed[0] != Version {
		return Plain{}, fmt.Errorf("%w: not a version-%d sealed value", ErrOpen, Version)
	}
	key, err := s.keys.SealKey(ctx, id)
	if err != nil {
		return Plain{}, fmt.Errorf("%w: key id %q: %w", ErrKeySource, id, err)
	}
	aead, err := s.aead(id, key)
	if err != nil {
		return Plain{}, err
	}
	// One allocation for the additional data and the opened envelope after
	// it (the envelope's body is then a slice of it).
	ad := appendAdditionalData(make([]byte, 0, additionalSize(id, row)+len(sealed)), sealed[0], id, row)
	pt, err := aead.Open(ad[len(ad):], nil, sealed[1:], ad)
	if err != nil {
		return Plain{}, ErrOpen
	}
	p, ok := parseEnvelope(pt)
	if !ok {
		return Plain{}, fmt.Errorf("%w: the envelope is malformed", ErrOpen)
	}
	return p, nil
}

// aead returns the AEAD of key id, building it once per key.
func (s *Sealer) aead(id string, key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("%w: key id %q: the key has %d bytes, want %d", ErrKeySource, id, len(key), KeySize)
	}
	s.mu.RLock()
	c := s.aeads[id]
	s.mu.RUnlock()
	if c != nil && subtle.ConstantTimeCompare(c.key[:], key) == 1 {
		return c.aead, nil
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%w: key id %q: %w", ErrKeySource, id, err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("%w: key id %q: %w", ErrKeySource, id, err)
	}
	c = &cachedAEAD{aead: aead}
	copy(c.key[:], key)
	s.mu.Lock()
	s.aeads[id] = c
	s.mu.Unlock()
	return aead, nil
}

// additionalData binds a value to its format, its key id and its row:
// every field prefixed with its length, so no two rows share one.
func additionalData(version byte, id string, r Row) []byte {
	return appendAdditionalData(make([]byte, 0, additionalSize(id, r)), version, id, r)
}

// additionalSize is the size of additionalData's result.
func additionalSize(id string, r Row) int {
	return 9*4 + 1 + len(id) + 8 + 4 + len(r.Scope) + len(r.Endpoint) + len(r.Key) + len(r.RequestHash) + 8
}

// appendAdditionalData appends additionalData's bytes to b.
func appendAdditionalData(b []byte, version byte, id string, r Row) []byte {
	b = append(binary.BigEndian.AppendUint32(b, 1), version)
	b = field(b, id)
	b = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), uint64(r.ID))
	b = binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(b, 4), uint32(r.Attempt))
	b = field(b, r.Scope)
	b = field(b, r.Endpoint)
	b = field(b, r.Key)
	b = field(b, r.RequestHash)
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), uint64(int64(r.Status)))
}

// field appends s prefixed with its length.
func field(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
