package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// retryableStatus is the contract's rule for an answer: whether the same
// request, with the same key and body, may be sent again. Only 400 and 409
// need the code (needsCode); 503 and 409 in flight need a Retry-After.
//
//   - 429, 502, 504: nothing ran, or the gateway does not know; the same
//     key makes a second execution impossible, so retry.
//   - 503 with Retry-After: the server asks for it (idempotency_store_unavailable
//     and the like). A 503 without it (a kill switch) is not retried.
//   - 409 idempotency_in_flight with Retry-After: the first request is still
//     running; its answer will be replayed.
//   - 400 idempotency_body_unreadable: the body did not arrive; nothing ran.
//   - everything else, notably 409 previous_failed / outcome_unknown /
//     response_not_stored, 422 and other 4xx: retrying cannot change the
//     answer (or, for outcome_unknown, only reconciling can).
func retryableStatus(status int, code string, hasRetryAfter bool) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusGatewayTimeout:
		return true
	case http.StatusServiceUnavailable:
		return hasRetryAfter
	case http.StatusConflict:
		return code == CodeInFlight && hasRetryAfter
	case http.StatusBadRequest:
		return code == CodeBodyUnreadable
	}
	return false
}

// needsCode reports whether retryableStatus looks at the code for status,
// so the body must be read.
func needsCode(status int) bool {
	return status == http.StatusConflict || status == http.StatusBadRequest
}

// retryableResponse applies retryableStatus to resp, reading (and
// restoring) its body when the code matters.
func retryableResponse(resp *http.Response) bool {
	code := ""
	if needsCode(resp.StatusCode) {
		code = peekCode(resp)
	}
	_, hasRetryAfter := retryAfter(resp)
	return retryableStatus(resp.StatusCode, code, hasRetryAfter)
}

// retryableErr reports whether a transport error may be retried: any error
// except a cancellation and a certificate the client refused (the retry
// would meet the same certificate).
func retryableErr(err error) bool {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
	)
	switch {
	case errors.Is(err, context.Canceled),
		errors.As(err, &verify), errors.As(err, &unknown),
		errors.As(err, &invalid), errors.As(err, &host):
		return false
	}
	return true
}

// CheckRetry reports whether a request should be retried by the rules of
// Transport. It has the signature of go-retryablehttp's CheckRetry, so it
// can be that client's policy:
//
//	client := retryablehttp.NewClient()
//	client.CheckRetry = idemclient.CheckRetry
//	client.Backoff = idemclient.Backoff
//
// (set the Idempotency-Key header once on the request: go-retryablehttp
// sends the same headers on every attempt). When ctx is done it returns
// false and ctx's error. A retryable answer whose Idempotency-Expires is
// less than ExpirySkew after its Retry-After returns false and
// ErrKeyExpiring. It reads a 400's or 409's body to find the code and puts
// it back, so resp.Body still reads whole.
func CheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return retryableErr(err), nil
	}
	if resp == nil || !retryableResponse(resp) {
		return false, nil
	}
	wait, _ := retryAfter(resp)
	if expires, ok := advertisedExpiry(resp); ok && expiring(expires, wait) {
		return false, keyExpiring(expires, 1, resp.StatusCode)
	}
	return true, nil
}

// Backoff returns how long to wait before retry attemptNum (from 0): the
// response's Retry-After when it has one, whatever its status, else an
// exponential backoff from minWait, capped at maxWait, with jitter (between half
// and all of it). It has the signature of go-retryablehttp's Backoff, whose
// default ignores Retry-After on a 409.
func Backoff(minWait, maxWait time.Duration, attemptNum int, resp *http.Response) time.Duration {
	if ra, ok := retryAfter(resp); ok {
		return ra
	}
	return jittered(minWait, maxWait, attemptNum)
}

// jittered returns lo doubled n times, capped at hi, minus a random part
// of up to half of it.
func jittered(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if d <= 1 {
		return max(d, 0)
	}
	return d - rand.N(d/2)
}

// retryAfter parses resp's Retry-After header (delay-seconds or an
// HTTP-date; a date in the past is 0), and reports whether it has a valid
// one.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}
