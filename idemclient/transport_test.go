package idemclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
)

// waitLimit is the generous bound for anything that must not hang.
const waitLimit = 60 * time.Second

// seen is one request as the test server received it.
type seen struct {
	method string
	keys   []string
	body   string
}

// script is a test server that answers its n-th request with steps[n]
// (the last step repeats) and records what it received.
type script struct {
	srv   *httptest.Server
	steps []http.HandlerFunc
	conns atomic.Int32 // connections opened

	mu   sync.Mutex
	reqs []seen
	got  chan struct{} // one send per request, buffered
}

func newScript(t *testing.T, steps ...http.HandlerFunc) *script {
	t.Helper()
	s := &script{steps: steps, got: make(chan struct{}, 100)}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Config.ConnState = func(_ net.Conn, cs http.ConnState) {
		if cs == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.reqs)
	s.reqs = append(s.reqs, seen{method: r.Method, keys: r.Header.Values(HeaderKey), body: string(raw)})
	s.mu.Unlock()
	s.got <- struct{}{}
	s.steps[min(n, len(s.steps)-1)](w, r)
}

func (s *script) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

// reply answers status with a JSON body and header pairs.
func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// hangUp closes the connection without an answer: the request arrived,
// the answer is lost.
func hangUp(w http.ResponseWriter, _ *http.Request) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		c.Close()
	}
}

var (
	created     = reply(201, `{"id":1}`)
	unavailable = reply(503, `{"error":"idempotency_store_unavailable"}`, "Retry-After", "0")
	inFlight    = reply(409, `{"error":"idempotency_in_flight","retry_after_ms":0}`, "Retry-After", "0")
)

// testTransport is a Transport over a base whose connections are closed
// when the test ends.
func testTransport(t *testing.T) *Transport {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return &Transport{Base: base, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
}

func post(t *testing.T, ctx context.Context, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// sameKeyAndBody checks that every request carried one key, the same,
// and body.
func sameKeyAndBody(t *testing.T, reqs []seen, body string) string {
	t.Helper()
	key := ""
	for i, r := range reqs {
		if len(r.keys) != 1 || r.keys[0] == "" || (key != "" && r.keys[0] != key) || r.body != body {
			t.Fatalf("attempt %d: keys %q body %q; want the one key %q and body %q", i+1, r.keys, r.body, key, body)
		}
		key = r.keys[0]
	}
	return key
}

// TestTransportRetries: every retryable answer and a lost answer are
// retried with the same generated key and the same body, until the
// answer that is not retried, which comes back whole.
func TestTransportRetries(t *testing.T) {
	t.Parallel()
	s := newScript(t, hangUp, unavailable, inFlight,
		reply(429, ""), reply(502, "<html>"), reply(504, ""),
		reply(400, `{"error":"idempotency_body_unreadable"}`),
		reply(409, `{"type":"https://idemkit.dev/problems/idempotency_in_flight","error":"idempotency_in_flight"}`, "Retry-After", "0", "Content-Type", "application/problem+json"),
		created)
	tr := testTransport(t)
	tr.MaxAttempts = 10
	var events []Retry
	tr.OnRetry = func(r Retry) { events = append(events, r) }
	const body = `{"symbol":"AAPL","side":"buy","qty":1}`
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || readAll(t, resp) != `{"id":1}` {
		t.Fatalf("answer %d, want 201 {\"id\":1}", resp.StatusCode)
	}
	reqs := s.seen()
	if len(reqs) != 9 {
		t.Fatalf("%d requests, want 9", len(reqs))
	}
	key := sameKeyAndBody(t, reqs, body)
	if len(key) != 36 {
		t.Fatalf("generated key %q is not a UUID", key)
	}
	wantStatus := []int{0, 503, 409, 429, 502, 504, 400, 409}
	wantCode := []string{"", CodeStoreUnavailable, CodeInFlight, "", "", "", CodeBodyUnreadable, CodeInFlight}
	if len(events) != len(wantStatus) {
		t.Fatalf("%d OnRetry calls, want %d", len(events), len(wantStatus))
	}
	for i, ev := range events {
		if ev.Attempt != i+1 || ev.Status != wantStatus[i] || ev.Code != wantCode[i] || (ev.Err != nil) != (i == 0) || ev.Request.Header.Get(HeaderKey) != key {
			t.Errorf("OnRetry %d: %+v, want attempt %d status %d code %q", i, ev, i+1, wantStatus[i], wantCode[i])
		}
	}
}

// TestTransportNeverRetries: answers that a retry cannot change come back
// after one request, their body intact.
func TestTransportNeverRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		code string
	}{
		{"409 previous failed", reply(409, `{"error":"idempotency_previous_failed"}`), CodePreviousFailed},
		{"409 outcome unknown", reply(409, `{"error":"idempotency_outcome_unknown"}`, "Retry-After", "0"), CodeOutcomeUnknown},
		{"409 not stored", reply(409, `{"error":"idempotency_response_not_stored","original_status":201}`), CodeResponseNotStored},
		{"409 in flight without Retry-After", reply(409, `{"error":"idempotency_in_flight"}`), CodeInFlight},
		{"422", reply(422, `{"error":"idempotency_key_body_mismatch"}`), CodeKeyBodyMismatch},
		{"422 key expired", reply(422, `{"error":"idempotency_key_expired"}`), CodeKeyExpired},
		{"400", reply(400, `{"error":"invalid_order"}`), "invalid_order"},
		{"413", reply(413, `{"error":"idempotency_body_too_large"}`), CodeBodyTooLarge},
		{"500", reply(500, `{"error":"fill_engine_error"}`), "fill_engine_error"},
		{"503 without Retry-After", reply(503, `{"error":"new_orders_disabled"}`), "new_orders_disabled"},
		{"201", created, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, tc.h, created)
			resp, err := testTransport(t).RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader(`{}`)))
			if err != nil {
				t.Fatal(err)
			}
			if e := ErrorFrom(resp); e != nil && e.Code != tc.code || e == nil && tc.code != "" {
				t.Fatalf("ErrorFrom = %v, want code %q", e, tc.code)
			}
			if got := readAll(t, resp); !strings.HasPrefix(got, "{") {
				t.Fatalf("body %q, want the server's", got)
			}
			if n := len(s.seen()); n != 1 {
				t.Fatalf("%d requests, want 1", n)
			}
		})
	}
}

// TestTransportKeys: a key in the header is kept, WithKey's is sent, the
// two disagreeing is an error that sends nothing, safe methods get none.
func TestTransportKeys(t *testing.T) {
	t.Parallel()
	s := newScript(t, unavailable, created)
	tr := testTransport(t)
	send := func(req *http.Request) []seen {
		t.Helper()
		before := len(s.seen())
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return s.seen()[before:]
	}

	req := post(t, context.Background(), s.srv.URL, strings.NewReader("a"))
	req.Header.Set(HeaderKey, "caller-key")
	if k := sameKeyAndBody(t, send(req), "a"); k != "caller-key" {
		t.Errorf("header key: sent %q, want caller-key", k)
	}

	ctx := WithKey(context.Background(), "ctx-key")
	if k := sameKeyAndBody(t, send(post(t, ctx, s.srv.URL, strings.NewReader("b"))), "b"); k != "ctx-key" {
		t.Errorf("WithKey: sent %q, want ctx-key", k)
	}

	req = post(t, ctx, s.srv.URL, strings.NewReader("c"))
	req.Header.Set(HeaderKey, "ctx-key") // the same: fine
	if k := sameKeyAndBody(t, send(req), "c"); k != "ctx-key" {
		t.Errorf("header and WithKey agreeing: sent %q, want ctx-key", k)
	}

	k1 := sameKeyAndBody(t, send(post(t, context.Background(), s.srv.URL, strings.NewReader("d"))), "d")
	k2 := sameKeyAndBody(t, send(post(t, context.Background(), s.srv.URL, strings.NewReader("d"))), "d")
	if k1 == k2 {
		t.Errorf("two RoundTrips without a key share the generated key %q", k1)
	}

	get, _ := http.NewRequest("GET", s.srv.URL, nil)
	for _, r := range send(get) {
		if len(r.keys) != 0 {
			t.Errorf("GET sent keys %q, want none", r.keys)
		}
	}

	before := len(s.seen())
	for _, tc := range []struct {
		name string
		ctx  context.Context
		hdr  []string
	}{
		{"differing", ctx, []string{"other-key"}},
		{"two headers", ctx, []string{"ctx-key", "ctx-key"}},
		{"empty WithKey", WithKey(context.Background(), ""), nil},
	} {
		closed := &closeSpy{Reader: strings.NewReader("e")}
		req, _ := http.NewRequestWithContext(tc.ctx, "POST", s.srv.URL, closed)
		for _, v := range tc.hdr {
			req.Header.Add(HeaderKey, v)
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: no error", tc.name)
		}
		if !closed.closed.Load() {
			t.Errorf("%s: the request body was not closed", tc.name)
		}
	}
	if n := len(s.seen()) - before; n != 0 {
		t.Errorf("key errors sent %d requests, want 0", n)
	}
}

// closeSpy is a body that records Close.
type closeSpy struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeSpy) Close() error { c.closed.Store(true); return nil }

// TestTransportBodies: a GetBody body and a small body are replayed byte
// for byte; a body too large to buffer, or any with buffering off, is sent
// once, whole, and never retried.
func TestTransportBodies(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("0123456789", 100)
	for _, tc := range []struct {
		name      string
		body      func() io.Reader
		buffer    int64
		wantTries int
	}{
		{"GetBody (bytes.Reader)", func() io.Reader { return bytes.NewReader([]byte(big)) }, -1, 2},
		{"buffered, unknown length", func() io.Reader { return iotest.HalfReader(strings.NewReader(big)) }, 0, 2},
		{"buffered at the limit", func() io.Reader { return iotest.OneByteReader(strings.NewReader(big)) }, int64(len(big)), 2},
		{"over the limit", func() io.Reader { return iotest.HalfReader(strings.NewReader(big)) }, int64(len(big)) - 1, 1},
		{"buffering off", func() io.Reader { return iotest.HalfReader(strings.NewReader(big)) }, -1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, unavailable, created)
			tr := testTransport(t)
			tr.MaxBufferedBody = tc.buffer
			req := post(t, context.Background(), s.srv.URL, tc.body())
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			reqs := s.seen()
			if len(reqs) != tc.wantTries {
				t.Fatalf("%d requests, want %d", len(reqs), tc.wantTries)
			}
			sameKeyAndBody(t, reqs, big)
		})
	}
}

// TestTransportLeavesRequestAlone: the caller's request is the same
// afterwards (headers, body, GetBody), so it can be sent again.
func TestTransportLeavesRequestAlone(t *testing.T) {
	t.Parallel()
	s := newScript(t, hangUp, unavailable, created)
	req := post(t, context.Background(), s.srv.URL, strings.NewReader("x"))
	req.Header.Set("X-Trace", "1")
	body, getBody, header := req.Body, req.GetBody, req.Header.Clone()
	resp, err := testTransport(t).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if req.Body != body || req.Header.Get(HeaderKey) != "" || len(req.Header) != len(header) || req.Header.Get("X-Trace") != "1" || req.ContentLength != 1 {
		t.Fatalf("the caller's request changed: header %v, body changed %v", req.Header, req.Body != body)
	}
	if got, _ := getBody(); got == nil {
		t.Fatal("GetBody broken")
	}
}

// TestTransportDrainsRetriedAnswers: the retried answers are read and
// closed, so every attempt reuses the one connection.
func TestTransportDrainsRetriedAnswers(t *testing.T) {
	t.Parallel()
	pad := `{"error":"idempotency_store_unavailable","pad":"` + strings.Repeat("x", 8<<10) + `"}`
	s := newScript(t, reply(503, pad, "Retry-After", "0"), reply(503, pad, "Retry-After", "0"), reply(502, pad), created)
	resp, err := testTransport(t).RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader("x")))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := len(s.seen()); n != 4 {
		t.Fatalf("%d requests, want 4", n)
	}
	if n := s.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 4 attempts, want 1 (retried answers not drained and closed)", n)
	}
}

// TestTransportBounds: attempts stop at MaxAttempts with the last answer;
// a Retry-After over MaxWait, or past the context's deadline, comes back
// at once.
func TestTransportBounds(t *testing.T) {
	t.Parallel()
	t.Run("attempts", func(t *testing.T) {
		t.Parallel()
		s := newScript(t, unavailable)
		tr := testTransport(t)
		tr.MaxAttempts = 3
		resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader("x")))
		if err != nil {
			t.Fatal(err)
		}
		if e := ErrorFrom(resp); e == nil || e.Code != CodeStoreUnavailable {
			t.Fatalf("last answer %v, want the 503", e)
		}
		readAll(t, resp)
		if n := len(s.seen()); n != 3 {
			t.Fatalf("%d requests, want MaxAttempts = 3", n)
		}
	})
	t.Run("transport errors", func(t *testing.T) {
		t.Parallel()
		s := newScript(t, hangUp)
		tr := testTransport(t)
		tr.MaxAttempts = 2
		_, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader("x")))
		if err == nil || !strings.Contains(err.Error(), "attempt 2") {
			t.Fatalf("err = %v, want the second attempt's error", err)
		}
		if n := len(s.seen()); n != 2 {
			t.Fatalf("%d requests, want 2", n)
		}
	})
	for _, tc := range []struct {
		name     string
		maxWait  time.Duration
		deadline time.Duration
	}{
		{"MaxWait", 10 * time.Second, 0},
		{"deadline", 0, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, reply(409, `{"error":"idempotency_in_flight"}`, "Retry-After", "3600"), created)
			tr := testTransport(t)
			tr.MaxWait = tc.maxWait
			ctx := context.Background()
			if tc.deadline > 0 {
				tr.MaxWait = 2 * time.Hour
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			resp, err := tr.RoundTrip(post(t, ctx, s.srv.URL, strings.NewReader("x")))
			if err != nil {
				t.Fatal(err)
			}
			if e := ErrorFrom(resp); e == nil || e.Code != CodeInFlight {
				t.Fatalf("answer %v, want the 409 in flight", e)
			}
			readAll(t, resp)
			if n := len(s.seen()); n != 1 {
				t.Fatalf("%d requests, want 1", n)
			}
		})
	}
}

// TestTransportCancelStopsWaiting: cancelling the context during a
// Retry-After wait ends RoundTrip at once with the context's error.
func TestTransportCancelStopsWaiting(t *testing.T) {
	t.Parallel()
	s := newScript(t, reply(409, `{"error":"idempotency_in_flight"}`, "Retry-After", "3600"), created)
	tr := testTransport(t)
	tr.MaxWait = 2 * time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	tr.OnRetry = func(Retry) { close(waiting) }
	done := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(post(t, ctx, s.srv.URL, strings.NewReader("x")))
		if resp != nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-waiting
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("RoundTrip still waiting %v after the cancel", waitLimit)
	}
	if n := len(s.seen()); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}
