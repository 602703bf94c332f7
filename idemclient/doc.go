// Package idemclient is the client side of the idempotency middleware's
// HTTP contract (github.com/idemkit/idempotency): keys per logical
// operation, retries only where they are safe, and typed errors. It imports
// nothing but the standard library.
//
// A Transport sends each request with an Idempotency-Key and retries it
// with the same key and the same body bytes after a lost connection (or
// an answer of up to 1 MiB cut mid-body: it is read whole first), a 503 or
// 409 in flight with Retry-After, a 429, 502 or 504, or a 400
// idempotency_body_unreadable, waiting at least Retry-After; it never
// retries 409 previous_failed, outcome_unknown or response_not_stored, 422
// or other 4xx, and never mints a new key for a retry, nor sends one less
// than ExpirySkew before the key's expiry the server advertised
// (Idempotency-Expires; ErrKeyExpiring instead):
//
//	client := &http.Client{Transport: &idemclient.Transport{}}
//
// For an operation that may be retried beyond one call (after a restart,
// from another process), make its key once with NewKey, store it with the
// operation, and send it with WithKey every time. ErrorFrom tells the
// contract's answers apart (idempotency_outcome_unknown means: reconcile,
// never retry with a new key). CheckRetry and Backoff give go-retryablehttp
// the same rules.
package idemclient
