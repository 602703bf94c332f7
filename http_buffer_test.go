package idempotency

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
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

// TestPlusJSONIsJSON: a *+json Content-Type (problem+json, vnd.api+json)
// is JSON: stored as JSON and replayed with the replay field.
func TestPlusJSONIsJSON(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"application/problem+json", "application/vnd.api+json; charset=utf-8"} {
		h := newHarness(t, Config{})
		rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"type":"about:blank"}`))
		})
		send(t, rt, "POST", "/orders", testKey, `{}`)
		w := send(t, rt, "POST", "/orders", testKey, `{}`)
		if w.Code != 400 || w.Body.String() != `{"idempotency_replayed":true,"type":"about:blank"}` || w.Header().Get("Content-Type") != ct {
			t.Errorf("%s: replay %d %q %s", ct, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		rows, _ := h.store.ExportScope(context.Background(), "")
		if len(rows) != 1 || rows[0].Response.BodyKind != BodyJSON {
			t.Errorf("%s: stored %+v, want one JSON body", ct, rows)
		}
	}
}

// TestInformationalPassedThrough: a 1xx answer (103 Early Hints) goes out
// as it comes and is not recorded; the final status is.
func TestInformationalPassedThrough(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		orderHandler(w, r)
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	post := func() (int, []int) {
		var mu sync.Mutex
		var infos []int
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			mu.Lock()
			defer mu.Unlock()
			infos = append(infos, code)
			return nil
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		return resp.StatusCode, infos
	}
	if code, infos := post(); code != 201 || len(infos) != 1 || infos[0] != 103 {
		t.Fatalf("original: %d after informational %v, want 201 after [103]", code, infos)
	}
	if code, infos := post(); code != 201 || len(infos) != 0 {
		t.Fatalf("replay: %d after informational %v, want 201 alone", code, infos)
	}
	if h.calls.Load() != 1 {
		t.Fatalf("calls %d", h.calls.Load())
	}
}

// TestNeverStoredHeaders: Date and the hop-by-hop headers can be neither
// allow-listed nor stored.
func TestNeverStoredHeaders(t *testing.T) {
	t.Parallel()
	never := []string{"Date", "Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
		"Proxy-Connection", "Content-Length", "Set-Cookie", "Authorization", "WWW-Authenticate", HeaderReplayed}
	h := newHarness(t, Config{})
	for _, name := range never {
		if _, err := h.mw.Route(RouteConfig{ReplayHeaders: []string{name}}); err == nil {
			t.Errorf("ReplayHeaders %q accepted", name)
		}
	}
	rt := h.route(RouteConfig{Name: "r", ReplayHeaders: []string{"X-Kept"}}, func(w http.ResponseWriter, r *http.Request) {
		for _, name := range never {
			w.Header().Set(name, "x")
		}
		w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
		w.Header().Set("X-Kept", "1")
		w.WriteHeader(201)
	})
	send(t, rt, "POST", "/r", testKey, `{}`)
	rows, _ := h.store.ExportScope(context.Background(), "")
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	if got := rows[0].Response.Header; len(got) != 1 || got.Get("X-Kept") != "1" {
		t.Fatalf("stored headers %v, want X-Kept alone", got)
	}
}

// TestOversizeStreamsThen409: a response that outgrows MaxResponseBytes
// streams (it has reached the client before the record is written); a
// duplicate that arrives before the record lands gets 409 in flight, one
// after gets 409 not stored with the original status.
func TestOversizeStreamsThen409(t *testing.T) {
	t.Parallel()
	spy := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
	completing, release := make(chan struct{}), make(chan struct{})
	s := &hookStore{MemoryStore: NewMemoryStore(), complete: func(context.Context, int) error {
		if !spy.sent.Load() || spy.Body.Len() != 16 {
			t.Errorf("at the record, the client has %d bytes, want all 16 (streamed)", spy.Body.Len())
		}
		close(completing)
		<-release
		return nil
	}}
	mw := newHooked(t, s, Config{})
	rt := mw.MustRoute(RouteConfig{Name: "export", MaxResponseBytes: 8})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		_, _ = w.Write([]byte("0123456789abcdef"))
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest("POST", "/export", strings.NewReader(`{}`))
		r.Header.Set(HeaderKey, testKey)
		rt.ServeHTTP(spy, r)
	}()
	<-completing
	assertJSONError(t, send(t, rt, "POST", "/export", testKey, `{}`), 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	close(release)
	<-done
	if spy.Code != 201 || spy.Body.String() != "0123456789abcdef" {
		t.Fatalf("original: %d %q", spy.Code, spy.Body)
	}
	assertJSONError(t, send(t, rt, "POST", "/export", testKey, `{}`), 409,
		`{"error":"idempotency_response_not_stored","original_status":201}`)
	if rows, _ := s.ExportScope(context.Background(), ""); len(rows) != 1 || rows[0].Response.BodyKind != BodyNone || rows[0].Response.Body != nil {
		t.Fatalf("stored %+v, want the record without its body", rows)
	}
}

// TestWriteHeaderCodeRange: the buffer takes every code net/http takes (100
// to 999) and panics, as net/http does, just outside that range.
func TestWriteHeaderCodeRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code      int
		wantPanic bool
	}{{99, true}, {100, false}, {999, false}, {1000, true}} {
		w := httptest.NewRecorder()
		b := newResponseBuffer(w, 1<<10, false)
		panicked := func() (p bool) {
			defer func() { p = recover() != nil }()
			b.WriteHeader(tc.code)
			return false
		}()
		if panicked != tc.wantPanic {
			t.Errorf("WriteHeader(%d): panicked %v, want %v", tc.code, panicked, tc.wantPanic)
		}
	}
	b := newResponseBuffer(httptest.NewRecorder(), 1<<10, false)
	b.WriteHeader(999)
	if got := b.statusCode(); got != 999 {
		t.Errorf("status after WriteHeader(999) = %d, want 999", got)
	}
}

// TestInformationalEdges: 100 to 199 (but 101) go out as they come and
// leave the final status unset; 200 is a final status, buffered until the
// record is written, never sent early as an informational answer.
func TestInformationalEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code          int
		informational bool
	}{{100, true}, {199, true}, {200, false}, {101, false}} {
		spy := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
		b := newResponseBuffer(spy, 1<<10, false)
		b.WriteHeader(tc.code)
		if spy.sent.Load() != tc.informational {
			t.Errorf("WriteHeader(%d): sent at once %v, want %v", tc.code, spy.sent.Load(), tc.informational)
		}
		if final := b.status != 0; final == tc.informational {
			t.Errorf("WriteHeader(%d): final status set %v, want %v", tc.code, final, !tc.informational)
		}
	}
}

// TestHoldCapEdge: a held-back (transactional) response of exactly the
// buffer cap is kept; one byte more drops it as too large.
func TestHoldCapEdge(t *testing.T) {
	t.Parallel()
	b := newResponseBuffer(httptest.NewRecorder(), 4, true)
	b.holdCap = 8
	if n, err := b.Write([]byte("12345678")); n != 8 || err != nil || b.tooLarge {
		t.Fatalf("a response of exactly the cap: wrote %d, %v, too large %v; want all of it kept", n, err, b.tooLarge)
	}
	if _, err := b.Write([]byte("9")); err == nil || !b.tooLarge {
		t.Fatalf("one byte past the cap: %v, too large %v; want it refused", err, b.tooLarge)
	}
}

// TestResponseLimitEdge: a response of exactly the route's response limit
// is recorded, one byte more is not, whether it was buffered or is being
// streamed (after a flush).
func TestResponseLimitEdge(t *testing.T) {
	t.Parallel()
	for _, streamed := range []bool{false, true} {
		b := newResponseBuffer(httptest.NewRecorder(), 8, false)
		b.WriteHeader(http.StatusOK)
		if streamed {
			b.startStreaming()
		}
		_, _ = b.Write([]byte("1234"))
		_, _ = b.Write([]byte("5678"))
		if b.overflow || b.buf.Len() != 8 {
			t.Fatalf("streamed %v: exactly the limit: overflow %v, %d bytes kept; want all 8 kept", streamed, b.overflow, b.buf.Len())
		}
		_, _ = b.Write([]byte("9"))
		if !b.overflow {
			t.Fatalf("streamed %v: one byte past the limit was kept for the record", streamed)
		}
	}
}
