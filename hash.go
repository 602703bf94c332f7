package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"

	"github.com/idemkit/idempotency/internal/jcs"
)

// Body kinds written into the request hash, so that a JSON body and a raw
// body with the same bytes never hash alike.
const (
	hashKindJSON = "json"
	hashKindRaw  = "raw"
)

// requestHash returns the 64-hex-character SHA-256 request hash that binds an
// idempotency key to one request: the same key sent with another method,
// path, query or body gets a different hash and so a 422, never someone
// else's replay.
//
// A body that internal/jcs canonicalises is hashed in its canonical form, so
// two encodings of the same JSON value (key order, white space, escapes) are
// the same request; any other body, the empty body included, is hashed as its
// raw bytes. See hashRequest for the exact framing.
func requestHash(method, escapedPath, rawQuery string, body []byte) string {
	c := jcs.Get()
	defer c.Release()
	if canonical, ok := c.Canonicalize(body); ok {
		return hashRequest(method, escapedPath, rawQuery, hashKindJSON, canonical)
	}
	return hashRequest(method, escapedPath, rawQuery, hashKindRaw, body)
}

// hashers recycles SHA-256 states and framing buffers, because a request
// hash is computed on every keyed request.
var hashers = sync.Pool{
	New: func() any { return &hasher{h: sha256.New()} },
}

// hasher is the reusable state of one request hash.
type hasher struct {
	hdr []byte // the framing of the text fields
	h   hash.Hash
	sum [sha256.Size]byte
}

// hashRequest hashes one request with a framing that is unambiguous for any
// input bytes: every text field is preceded by its length as an 8-byte
// big-endian integer, and the body, the last field, runs to the end:
//
//	SHA-256( len(method) method  len(escapedPath) escapedPath
//	         len(rawQuery) rawQuery  len(kind) kind  payload )
//
// kind is "json" (payload is the canonical body) or "raw" (payload is the
// body as received). Lengths rather than separators keep the fields apart even
// if a path or query ever carried a NUL byte.
func hashRequest(method, escapedPath, rawQuery, kind string, payload []byte) string {
	s := hashers.Get().(*hasher)
	s.hdr = appendHashField(s.hdr[:0], method)
	s.hdr = appendHashField(s.hdr, escapedPath)
	s.hdr = appendHashField(s.hdr, rawQuery)
	s.hdr = appendHashField(s.hdr, kind)
	s.h.Reset()
	s.h.Write(s.hdr)
	s.h.Write(payload)
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], s.h.Sum(s.sum[:0]))
	if cap(s.hdr) > 64<<10 {
		s.hdr = nil // one huge path must not pin its memory in the pool
	}
	hashers.Put(s)
	return string(hexSum[:])
}

// appendHashField appends s preceded by its length, the framing of
// hashRequest.
func appendHashField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}
