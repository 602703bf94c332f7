package idemclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// NewKey returns a new random idempotency key: a version 4 UUID in its
// 36-character lower-case form, the form the middleware requires by default.
//
// Mint one key per logical operation (one order, one payment), not per
// attempt: every retry of that operation, from this process or another,
// must send the same key.
func NewKey() string {
	var u [16]byte
	_, _ = rand.Read(u[:])  // never fails (crypto/rand crashes the program instead)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return string(s[:])
}

// keyCtx is the context key of the caller's idempotency key.
type keyCtx struct{}

// WithKey returns a copy of ctx that carries key, the caller's idempotency
// key for one logical operation. A Transport sends it as the
// Idempotency-Key header of a request made with that context, on every
// attempt, instead of minting a key of its own.
//
// Use WithKey when the operation may be retried beyond one RoundTrip: by
// the caller after an error, by another process, or after a restart. Then
// store the key with the pending operation before the first attempt, and
// send the stored key each time. An empty key makes RoundTrip fail.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFromContext returns the key WithKey put into ctx, and whether there
// is one.
func KeyFromContext(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(keyCtx{}).(string)
	return key, ok
}
