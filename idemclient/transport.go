package idemclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Transport is an http.RoundTripper that sends each request with an
// Idempotency-Key and retries it, with the same key and the same body
// bytes, where the middleware's contract says a retry is safe and useful:
// a transport error (the connection dropped, the answer was lost, or its
// body was cut before its end: see MaxBufferedResponse), 503 with
// Retry-After, 409 idempotency_in_flight with Retry-After, 429, 502, 504
// and 400 idempotency_body_unreadable. It never retries any other
// answer (409 idempotency_previous_failed, idempotency_outcome_unknown and
// idempotency_response_not_stored, 422, other 4xx, 500), and never mints a
// new key for a retry. Waits honour Retry-After, are jittered, and end with
// the request's context; the attempts are bounded by MaxAttempts. A retry
// that would be sent less than ExpirySkew before the key's expiry, as an
// answer advertised it (Idempotency-Expires), is not sent: RoundTrip
// returns ErrKeyExpiring.
//
// The key is, in order: the request's own Idempotency-Key header (kept as
// it is); the key of WithKey in the request's context (both present and
// different: an error); or a new key (NewKey) per RoundTrip, for every
// method but the safe ones (GET, HEAD, OPTIONS, TRACE), which get none
// and are retried by the same rules.
//
// The body is replayed from the request's GetBody (http.NewRequest sets it
// for the usual readers), or from memory when it is at most
// MaxBufferedBody bytes; any other body is sent once and never retried.
// RoundTrip never changes the caller's request.
//
// Use it only towards routes that honour Idempotency-Key (or are
// idempotent anyway): a server that ignores the key executes every retry.
// When an answer after a retry is an error, ErrorFrom tells which.
//
// The zero value is ready to use. A Transport is safe for concurrent use.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// MaxAttempts bounds the attempts of one RoundTrip, the first one
	// included. Defaults to 5.
	MaxAttempts int
	// MinBackoff is the wait before the first retry when the answer has no
	// Retry-After; each retry doubles it, up to MaxBackoff, and takes off
	// a random part of up to half (jitter). Defaults to 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps that wait. Defaults to 5s.
	MaxBackoff time.Duration
	// MaxWait is the longest one wait may be: an answer whose Retry-After
	// asks for more is returned instead of retried. Waits never outlast
	// the request context's deadline either: an answer whose wait would is
	// returned at once. Defaults to 30s.
	MaxWait time.Duration
	// MaxBufferedBody is the largest body without GetBody that is read
	// into memory to be replayable; a negative value buffers none.
	// Defaults to 1 MiB.
	MaxBufferedBody int64
	// MaxBufferedResponse is the largest answer body that is read whole
	// before RoundTrip returns, so that a body cut before its end is
	// retried like a lost answer (same key, same body: the retry gets the
	// replay) and the caller never reads a short body. A larger answer,
	// or one of Content-Type text/event-stream, streams: a cut is then the
	// body's read error, and the caller retries with the same key (the
	// one on resp.Request). A negative value buffers none. Defaults to
	// 1 MiB, the middleware's default response limit.
	MaxBufferedResponse int64
	// OnRetry, when set, is called before each wait for a retry (for logs
	// and metrics). It must not keep the Retry's Request.
	OnRetry func(Retry)
}

// Retry describes an attempt that is about to be retried.
type Retry struct {
	Request *http.Request // the attempt's request, key header included
	Attempt int           // the attempt that is retried, from 1
	Status  int           // its answer's status; 0 after a transport error
	Code    string        // its answer's error code (see Error.Code), if any
	Err     error         // the transport error, if any
	Wait    time.Duration // the wait before the next attempt
}

// Defaults of Transport's fields.
const (
	defaultMaxAttempts     = 5
	defaultMinBackoff      = 100 * time.Millisecond
	defaultMaxBackoff      = 5 * time.Second
	defaultMaxWait         = 30 * time.Second
	defaultMaxBufferedBody = 1 << 20
	defaultMaxBufferedResp = 1 << 20
)

// maxDrain bounds how much of a retried answer is read so that its
// connection can be reused.
const maxDrain = 64 << 10

// errKeyConflict is returned when the request's header and WithKey name
// different keys.
var errKeyConflict = errors.New("idemclient: the request's Idempotency-Key header and the key of WithKey differ")

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, err := keyFor(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	b, err := newBody(req, cmp.Or(t.MaxBufferedBody, defaultMaxBufferedBody))
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	out := req.Clone(ctx)
	if key != "" {
		out.Header.Set(HeaderKey, key)
	}
	var expires time.Time // the key's expiry, as the last answer that said it advertised
	for n := 1; ; n++ {
		attempt := out.WithContext(ctx) // a request of its own: the last one may still be in use
		if err := b.forAttempt(attempt, n); err != nil {
			return nil, err
		}
		resp, err := t.base().RoundTrip(attempt)
		if err == nil {
			resp, err = readWhole(resp, cmp.Or(t.MaxBufferedResponse, defaultMaxBufferedResp))
		}
		if at, ok := advertisedExpiry(resp); ok {
			expires = at
		}
		wait, retry := t.retry(ctx, n, b.replayable, resp, err)
		if !retry {
			if err != nil && n > 1 {
				err = fmt.Errorf("idemclient: attempt %d: %w", n, err)
			}
			return resp, err
		}
		if expiring(expires, wait) {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			discard(resp)
			return nil, keyExpiring(expires, n, status)
		}
		if t.OnRetry != nil {
			t.OnRetry(retryEvent(attempt, n, resp, err, wait))
		}
		discard(resp)
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// keyFor returns the key to send with req: "" when the header already
// carries one or when a safe method gets none.
func keyFor(req *http.Request) (string, error) {
	ctxKey, hasCtxKey := KeyFromContext(req.Context())
	if hasCtxKey && ctxKey == "" {
		return "", errors.New("idemclient: WithKey: empty key")
	}
	if vs := req.Header.Values(HeaderKey); len(vs) > 0 {
		if hasCtxKey && (len(vs) != 1 || vs[0] != ctxKey) {
			return "", errKeyConflict
		}
		return "", nil
	}
	switch {
	case hasCtxKey:
		return ctxKey, nil
	case isSafe(req.Method):
		return "", nil
	}
	return NewKey(), nil
}

// isSafe reports whether method is safe (RFC 9110): such requests need no
// key to be retried.
func isSafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// retry decides whether attempt n, which got resp or err, is retried and
// after what wait.
func (t *Transport) retry(ctx context.Context, n int, replayable bool, resp *http.Response, err error) (time.Duration, bool) {
	if !replayable || n >= cmp.Or(t.MaxAttempts, defaultMaxAttempts) || ctx.Err() != nil {
		return 0, false
	}
	if err != nil && !retryableErr(err) || err == nil && !retryableResponse(resp) {
		return 0, false
	}
	wait := jittered(cmp.Or(t.MinBackoff, defaultMinBackoff), cmp.Or(t.MaxBackoff, defaultMaxBackoff), n-1)
	if ra, ok := retryAfter(resp); ok {
		// Never earlier than asked; a little later, so that clients told
		// the same moment do not all come back at once.
		wait = ra + jittered(ra/10, ra/10, 0)
	}
	if wait > cmp.Or(t.MaxWait, defaultMaxWait) {
		return 0, false
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		return 0, false
	}
	return wait, true
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func retryEvent(req *http.Request, n int, resp *http.Response, err error, wait time.Duration) Retry {
	ev := Retry{Request: req, Attempt: n, Err: err, Wait: wait}
	if e := ErrorFrom(resp); e != nil {
		ev.Status, ev.Code = e.Status, e.Code
	} else if resp != nil {
		ev.Status = resp.StatusCode
	}
	return ev
}

// discard reads a little of an answer that is retried, so its connection
// can be reused, and closes it.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	resp.Body.Close()
}

// sleep waits for d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
