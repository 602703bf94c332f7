package idemclient

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRetryableStatus is the contract's retry table.
func TestRetryableStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status        int
		code          string
		hasRetryAfter bool
		want          bool
	}{
		{503, CodeStoreUnavailable, true, true},
		{503, "database_unavailable", true, true},
		{503, CodeStoreUnavailable, false, false}, // no Retry-After: not asked to
		{503, "new_orders_disabled", false, false},
		{409, CodeInFlight, true, true},
		{409, CodeInFlight, false, false},
		{409, CodePreviousFailed, true, false},
		{409, CodeOutcomeUnknown, true, false},
		{409, CodeOutcomeUnknown, false, false},
		{409, CodeResponseNotStored, false, false},
		{409, "order_not_cancellable", true, false},
		{409, "", true, false},
		{429, "", false, true},
		{429, "", true, true},
		{502, "", false, true},
		{504, "", false, true},
		{504, "fill_timeout", false, true}, // the key is failed: the retry gets 409 previous_failed
		{400, CodeBodyUnreadable, false, true},
		{400, "invalid_order", false, false},
		{400, "Idempotency-Key must be a UUID string", false, false},
		{400, CodeScopeInvalid, false, false},
		{413, CodeBodyTooLarge, false, false},
		{422, CodeKeyBodyMismatch, false, false},
		{422, CodeKeyBodyMismatch, true, false},
		{422, CodeKeyExpired, true, false},
		{401, "unauthorized", false, false},
		{404, "not_found", false, false},
		{500, "fill_engine_error", false, false},
		{500, CodeResponseTooLarge, false, false},
		{501, "", true, false},
		{200, "", false, false},
		{201, "", true, false},
	} {
		if got := retryableStatus(tc.status, tc.code, tc.hasRetryAfter); got != tc.want {
			t.Errorf("retryableStatus(%d, %q, retryAfter=%v) = %v, want %v", tc.status, tc.code, tc.hasRetryAfter, got, tc.want)
		}
	}
}

// answer builds a response as a client would receive it.
func answer(status int, contentType, body string, header ...string) *http.Response {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}

// TestCheckRetry: the go-retryablehttp predicate decides by status, code
// (from either body form) and Retry-After, and leaves the body readable.
func TestCheckRetry(t *testing.T) {
	t.Parallel()
	const problem = "application/problem+json"
	for _, tc := range []struct {
		name string
		resp *http.Response
		want bool
	}{
		{"409 in flight", answer(409, "application/json", `{"error":"idempotency_in_flight","retry_after_ms":5000}`, "Retry-After", "5"), true},
		{"409 in flight, problem+json", answer(409, problem, `{"type":"https://idemkit.dev/problems/idempotency_in_flight","status":409,"title":"In flight","error":"idempotency_in_flight"}`, "Retry-After", "5"), true},
		{"409 in flight, problem+json type only", answer(409, problem, `{"type":"https://example.com/errors/idempotency-in-flight","status":409}`, "Retry-After", "5"), true},
		{"409 in flight, charset", answer(409, "application/json; charset=utf-8", `{"error":"idempotency_in_flight"}`, "Retry-After", "1"), true},
		{"409 in flight without Retry-After", answer(409, "application/json", `{"error":"idempotency_in_flight"}`), false},
		{"409 in flight, bad Retry-After", answer(409, "application/json", `{"error":"idempotency_in_flight"}`, "Retry-After", "soon"), false},
		{"409 in flight, not JSON", answer(409, "text/plain", `{"error":"idempotency_in_flight"}`, "Retry-After", "5"), false},
		{"409 previous failed", answer(409, "application/json", `{"error":"idempotency_previous_failed"}`, "Retry-After", "5"), false},
		{"409 previous failed, problem+json", answer(409, problem, `{"type":"https://idemkit.dev/problems/idempotency_previous_failed","error":"idempotency_previous_failed"}`), false},
		{"409 outcome unknown", answer(409, "application/json", `{"error":"idempotency_outcome_unknown"}`), false},
		{"409 outcome unknown, problem+json type only", answer(409, problem, `{"type":"urn:idemkit:idempotency_outcome_unknown"}`, "Retry-After", "5"), false},
		{"409 not stored", answer(409, "application/json", `{"error":"idempotency_response_not_stored","original_status":201}`), false},
		{"400 body unreadable", answer(400, "application/json", `{"error":"idempotency_body_unreadable"}`), true},
		{"400 body unreadable, problem+json", answer(400, problem, `{"type":"about:blank","error":"idempotency_body_unreadable"}`), true},
		{"400 other", answer(400, "application/json", `{"error":"invalid_order"}`), false},
		{"422", answer(422, "application/json", `{"error":"idempotency_key_body_mismatch"}`), false},
		{"503 with Retry-After", answer(503, "application/json", `{"error":"idempotency_store_unavailable"}`, "Retry-After", "1"), true},
		{"503 with an HTTP-date", answer(503, "", ``, "Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)), true},
		{"503 without Retry-After", answer(503, "application/json", `{"error":"new_orders_disabled"}`), false},
		{"429", answer(429, "", ``), true},
		{"502", answer(502, "text/html", `<html>bad gateway</html>`), true},
		{"504", answer(504, "", ``), true},
		{"500", answer(500, "application/json", `{"error":"fill_engine_error"}`), false},
		{"201", answer(201, "application/json", `{"id":1}`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _ := io.ReadAll(tc.resp.Body)
			tc.resp.Body = io.NopCloser(strings.NewReader(string(want)))
			got, err := CheckRetry(context.Background(), tc.resp, nil)
			if err != nil || got != tc.want {
				t.Fatalf("CheckRetry = %v, %v; want %v, nil", got, err, tc.want)
			}
			if rest, _ := io.ReadAll(tc.resp.Body); string(rest) != string(want) {
				t.Fatalf("body after CheckRetry = %q, want %q", rest, want)
			}
		})
	}
}

func TestCheckRetryErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true},
		{fmt.Errorf("wrapped: %w", io.EOF), true},
		{context.DeadlineExceeded, true}, // a per-attempt timeout of the base; the request's own ctx is checked first
		{context.Canceled, false},
		{x509.UnknownAuthorityError{}, false},
		{fmt.Errorf("tls: %w", x509.HostnameError{Host: "x"}), false},
	} {
		got, err := CheckRetry(context.Background(), nil, tc.err)
		if err != nil || got != tc.want {
			t.Errorf("CheckRetry(%v) = %v, %v; want %v, nil", tc.err, got, err, tc.want)
		}
	}
	if got, err := CheckRetry(context.Background(), nil, nil); got || err != nil {
		t.Errorf("CheckRetry(nil, nil) = %v, %v; want false, nil", got, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp := answer(503, "", "", "Retry-After", "1")
	if got, err := CheckRetry(ctx, resp, nil); got || !errors.Is(err, context.Canceled) {
		t.Errorf("CheckRetry with ctx done = %v, %v; want false, context.Canceled", got, err)
	}
}

// TestBackoff: Retry-After wins on every status (go-retryablehttp's
// default ignores it on 409); otherwise exponential with jitter, capped.
func TestBackoff(t *testing.T) {
	t.Parallel()
	inFlight := answer(409, "application/json", `{"error":"idempotency_in_flight"}`, "Retry-After", "5")
	if got := Backoff(time.Second, 30*time.Second, 0, inFlight); got != 5*time.Second {
		t.Errorf("Backoff on 409 with Retry-After 5 = %v, want 5s", got)
	}
	past := answer(503, "", "", "Retry-After", time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat))
	if got := Backoff(time.Second, 30*time.Second, 0, past); got != 0 {
		t.Errorf("Backoff with a past date = %v, want 0", got)
	}
	for n, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second} {
		for range 50 {
			got := Backoff(100*time.Millisecond, time.Second, n, nil)
			if got < want/2 || got > want {
				t.Fatalf("Backoff(attempt %d) = %v, want within [%v, %v]", n, got, want/2, want)
			}
		}
	}
}
