package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/lossyproxy"
)

// behindProxy puts a lossy proxy in front of s that applies faults to its
// requests in turn (then passes), and returns the proxy's URL.
func behindProxy(t *testing.T, s *script, faults ...lossyproxy.Fault) string {
	t.Helper()
	target, err := url.Parse(s.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyproxy.Proxy{Target: target, Plan: func(n int, _ *http.Request) lossyproxy.Fault {
		if n <= len(faults) {
			return faults[n-1]
		}
		return lossyproxy.Pass
	}}
	ps := httptest.NewServer(p)
	t.Cleanup(func() { ps.Close(); p.Close() })
	return ps.URL
}

// order is an answer of some size: cut in half, it is no longer JSON.
var order = `{"id":1,"fills":"` + strings.Repeat("x", 4000) + `"}`

// TestCutBodyRetried: an answer of at most MaxBufferedResponse whose body
// is cut before its end is retried like a lost answer, with the same key
// and body, and RoundTrip returns the next answer whole. Before, the cut
// reached the caller as a 201 whose read failed, after one attempt.
func TestCutBodyRetried(t *testing.T) {
	t.Parallel()
	s := newScript(t, reply(201, order))
	tr := testTransport(t)
	var events []Retry
	tr.OnRetry = func(r Retry) { events = append(events, r) }
	const body = `{"qty":1}`
	resp, err := tr.RoundTrip(post(t, context.Background(), behindProxy(t, s, lossyproxy.CutBody), strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); resp.StatusCode != 201 || got != order {
		t.Fatalf("answer %d with %d bytes, want 201 with the whole %d", resp.StatusCode, len(got), len(order))
	}
	sameKeyAndBody(t, s.seen(), body)
	if n := len(s.seen()); n != 2 {
		t.Fatalf("the server saw %d requests, want 2", n)
	}
	if len(events) != 1 || !errors.Is(events[0].Err, io.ErrUnexpectedEOF) || events[0].Status != 0 {
		t.Fatalf("OnRetry events %+v, want one for the cut body (an unexpected EOF)", events)
	}
}

// TestCutBodyOnTheLastAttempt: a cut on the last attempt is RoundTrip's
// error, as a lost answer would be, never a response that reads short.
func TestCutBodyOnTheLastAttempt(t *testing.T) {
	t.Parallel()
	s := newScript(t, reply(201, order))
	tr := testTransport(t)
	tr.MaxAttempts = 2
	u := behindProxy(t, s, lossyproxy.CutBody, lossyproxy.CutBody)
	resp, err := tr.RoundTrip(post(t, context.Background(), u, strings.NewReader(`{}`)))
	if err == nil {
		readAll(t, resp)
		t.Fatalf("RoundTrip returned %d and no error after two cut answers", resp.StatusCode)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(s.seen()) != 2 {
		t.Fatalf("err %v after %d requests, want an unexpected EOF after 2", err, len(s.seen()))
	}
}

// TestLargeAnswerStreams: an answer over MaxBufferedResponse is returned
// as it arrives; a cut is then the body's read error (the caller retries
// with the same key), after one request.
func TestLargeAnswerStreams(t *testing.T) {
	t.Parallel()
	s := newScript(t, reply(201, order))
	tr := testTransport(t)
	tr.MaxBufferedResponse = 1024
	resp, err := tr.RoundTrip(post(t, context.Background(), behindProxy(t, s, lossyproxy.CutBody), strings.NewReader(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || !errors.Is(err, io.ErrUnexpectedEOF) || len(got) != len(order)/2 {
		t.Fatalf("answer %d, read %d bytes then %v; want 201, half of %d bytes, then an unexpected EOF", resp.StatusCode, len(got), err, len(order))
	}
	if n := len(s.seen()); n != 1 || resp.Request.Header.Get(HeaderKey) != s.seen()[0].keys[0] {
		t.Fatalf("%d requests; the key to retry with (%q) must be on resp.Request", n, resp.Request.Header.Get(HeaderKey))
	}
}

// TestEventStreamNotBuffered: an event stream is returned at once, not
// read until it ends (it may never end).
func TestEventStreamNotBuffered(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 1\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	tr := testTransport(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := tr.RoundTrip(post(t, ctx, s.srv.URL, strings.NewReader(`{}`)))
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "data: 1\n\n" {
		t.Fatalf("event stream %q", got)
	}
}

// TestChunkedCutRetried: an answer of unknown length (chunked, as a
// streamed or compressed one is) is read whole too when it ends within
// MaxBufferedResponse, so a cut before its last chunk is retried.
func TestChunkedCutRetried(t *testing.T) {
	t.Parallel()
	cut := func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(201)
		_, _ = io.WriteString(w, order[:3000])
		_ = http.NewResponseController(w).Flush() // chunked: no Content-Length
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close() // before the last chunk
		}
	}
	s := newScript(t, cut, reply(201, order))
	resp, err := testTransport(t).RoundTrip(post(t, context.Background(), s.srv.URL, strings.NewReader(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != order || len(s.seen()) != 2 {
		t.Fatalf("read %d bytes after %d requests, want %d after 2", len(got), len(s.seen()), len(order))
	}
}

// TestProtocolSwitchNotBuffered: a 101's body is the connection itself:
// it is returned at once, never read until it ends.
func TestProtocolSwitchNotBuffered(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newScript(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "test")
		w.WriteHeader(http.StatusSwitchingProtocols)
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		select {
		case <-release:
		case <-time.After(waitLimit):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	req := post(t, ctx, s.srv.URL, strings.NewReader(`{}`))
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "test")
	resp, err := testTransport(t).RoundTrip(req)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, ok := resp.Body.(io.Writer); resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		t.Fatalf("answer %d with body %T, want 101 and the connection", resp.StatusCode, resp.Body)
	}
}
