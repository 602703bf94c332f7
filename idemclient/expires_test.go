package idemclient

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// expiresIn is an Idempotency-Expires value d from now.
func expiresIn(d time.Duration) string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }

// TestTransportStopsBeforeTheKeyExpires: a retryable answer whose key the
// server keeps for less than ExpirySkew more is not retried: RoundTrip
// returns ErrKeyExpiring after one attempt (through http.Client too). An
// expiry learnt from an earlier answer still holds for a later answer
// without one; a key far from its expiry is retried as before.
func TestTransportStopsBeforeTheKeyExpires(t *testing.T) {
	t.Parallel()
	near := newScript(t, reply(503, `{"error":"idempotency_store_unavailable"}`, "Retry-After", "0", HeaderExpires, expiresIn(30*time.Second)), created)
	client := &http.Client{Transport: testTransport(t)}
	resp, err := client.Do(post(t, t.Context(), near.srv.URL, strings.NewReader(`{"a":1}`)))
	if !errors.Is(err, ErrKeyExpiring) || resp != nil {
		t.Fatalf("near the expiry: %v %v, want ErrKeyExpiring", resp, err)
	}
	if n := len(near.seen()); n != 1 {
		t.Fatalf("%d attempts near the expiry, want 1", n)
	}

	// The first answer says the key lives 65 s more: a retry after a second
	// is safe; the second answer says nothing and asks for 5 s, past the
	// skew of the expiry the first one gave.
	later := newScript(t,
		reply(409, `{"error":"idempotency_in_flight"}`, "Retry-After", "1", HeaderExpires, expiresIn(65*time.Second)),
		reply(503, `{"error":"idempotency_store_unavailable"}`, "Retry-After", "5"), created)
	resp, err = testTransport(t).RoundTrip(post(t, t.Context(), later.srv.URL, strings.NewReader(`{"a":1}`)))
	if !errors.Is(err, ErrKeyExpiring) || resp != nil || len(later.seen()) != 2 {
		t.Fatalf("an expiry from an earlier answer: %v %v after %d attempts, want ErrKeyExpiring after 2", resp, err, len(later.seen()))
	}
	sameKeyAndBody(t, later.seen(), `{"a":1}`)

	far := newScript(t, reply(503, `{"error":"idempotency_store_unavailable"}`, "Retry-After", "0", HeaderExpires, expiresIn(10*time.Minute)), created)
	resp, err = testTransport(t).RoundTrip(post(t, t.Context(), far.srv.URL, strings.NewReader(`{"a":1}`)))
	if err != nil || resp.StatusCode != 201 || len(far.seen()) != 2 {
		t.Fatalf("far from the expiry: %v %v after %d attempts, want 201 after 2", resp, err, len(far.seen()))
	}
	resp.Body.Close()

	// An answer that is not retried is returned as it is, however near its
	// key's expiry.
	done := newScript(t, reply(201, `{"id":1}`, HeaderExpires, expiresIn(time.Second)))
	resp, err = testTransport(t).RoundTrip(post(t, t.Context(), done.srv.URL, strings.NewReader(`{"a":1}`)))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("a 201 near its expiry: %v %v, want it returned", resp, err)
	}
	resp.Body.Close()
}

// TestCheckRetryStopsBeforeTheKeyExpires: CheckRetry refuses a retryable
// answer whose key expires less than ExpirySkew after its Retry-After,
// with ErrKeyExpiring, and keeps its verdict on every other answer.
func TestCheckRetryStopsBeforeTheKeyExpires(t *testing.T) {
	t.Parallel()
	answer := func(status int, h ...string) *http.Response {
		w := httptest.NewRecorder()
		reply(status, `{"error":"idempotency_in_flight"}`, h...)(w, nil)
		return w.Result()
	}
	ctx := context.Background()
	for _, c := range []struct {
		what  string
		resp  *http.Response
		retry bool
		err   error
	}{
		{"in flight, the key expiring", answer(409, "Retry-After", "5", HeaderExpires, expiresIn(64*time.Second)), false, ErrKeyExpiring},
		{"in flight, the key kept long", answer(409, "Retry-After", "5", HeaderExpires, expiresIn(time.Hour)), true, nil},
		{"in flight, no expiry", answer(409, "Retry-After", "5"), true, nil},
		{"a 201 expiring", answer(201, HeaderExpires, expiresIn(time.Second)), false, nil},
	} {
		retry, err := CheckRetry(ctx, c.resp, nil)
		if retry != c.retry || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: %v %v, want %v %v", c.what, retry, err, c.retry, c.err)
		}
	}
}
