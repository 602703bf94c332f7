package idempotency

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestStreamingHandler: a handler that flushes streams its response; the
// record follows and the retry replays the whole body.
func TestStreamingHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	firstSent := make(chan struct{})
	proceed := make(chan struct{})
	rt := h.route(RouteConfig{Name: "stream"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("part1;"))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		close(firstSent)
		<-proceed
		_, _ = w.Write([]byte("part2"))
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set(HeaderKey, testKey)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-firstSent
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "part1;" {
		t.Fatalf("first part not streamed before the handler finished: %q %v", buf, err)
	}
	close(proceed)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "part2" {
		t.Fatalf("rest = %q", rest)
	}
	w := send(t, rt, "POST", "/", testKey, `{}`)
	if w.Body.String() != "part1;part2" || w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("replay = %q", w.Body)
	}
}

func TestHijackRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var herr error
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) {
		_, _, herr = http.NewResponseController(w).Hijack()
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Set(HeaderKey, testKey)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !errors.Is(herr, errHijack) {
		t.Fatalf("Hijack error = %v", herr)
	}
}

// TestEncodedBodyIsRecordedRaw: a body with a content coding is bytes, not
// JSON text, even when they happen to parse: it is recorded raw, so a replay
// neither re-encodes it through JSONB nor adds "idempotency_replayed" to it.
func TestEncodedBodyIsRecordedRaw(t *testing.T) {
	t.Parallel()
	rec := newResponseBuffer(httptest.NewRecorder(), DefaultMaxResponseBytes, false)
	rec.Header().Set("Content-Type", "application/json")
	rec.Header().Set("Content-Encoding", "x-custom")
	_, _ = io.WriteString(rec, `{"b":1, "a":2}`)
	resp := rec.response(defaultReplayHeaders)
	if resp.BodyKind != BodyRaw || string(resp.Body) != `{"b":1, "a":2}` || resp.Header.Get("Content-Encoding") != "x-custom" {
		t.Fatalf("recorded %v %q with headers %v, want the raw bytes with their Content-Encoding", resp.BodyKind, resp.Body, resp.Header)
	}
}
