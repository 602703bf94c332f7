package idempotency

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestStalledBodyIsAnswered: a client that sends part of its body and then
// stalls gets its 400 or 413 soon after the body timeout, with Connection:
// close, and the server closes the connection. Served by a real http.Server
// whose ReadTimeout is far longer than the test's bound: readBody used to
// clear that deadline, and net/http then drained the unread rest of the
// body, without any deadline, before it sent the answer. Behind a wrapper
// that hides the connection's deadlines, Connection: close alone still
// sends a 413 at once.
func TestStalledBodyIsAnswered(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 200 * time.Millisecond
	const bound = 25 * bodyTimeout // never hangs: the answer comes long before
	tests := []struct {
		name    string
		request string // everything the client sends before it stalls
		status  int
		body    string
		wrapped bool // behind a ResponseWriter wrapper without Unwrap: no read deadlines
	}{
		{"declared length, stalls mid-body",
			"Content-Length: 50\r\n\r\n" + `{"a":`, 400, `{"error":"idempotency_body_unreadable"}`, false},
		{"chunked, stalls mid-body",
			"Transfer-Encoding: chunked\r\n\r\n5\r\n" + `{"a":` + "\r\n", 400, `{"error":"idempotency_body_unreadable"}`, false},
		{"chunked, over the limit, then stalls",
			"Transfer-Encoding: chunked\r\n\r\n50\r\n" + strings.Repeat("x", 80) + "\r\n", 413, `{"error":"idempotency_body_too_large"}`, false},
		{"declared over the limit, stalls",
			"Content-Length: 1000\r\n\r\nxxxxx", 413, `{"error":"idempotency_body_too_large"}`, false},
		{"no deadlines, chunked, over the limit, then stalls",
			"Transfer-Encoding: chunked\r\n\r\n50\r\n" + strings.Repeat("x", 80) + "\r\n", 413, `{"error":"idempotency_body_too_large"}`, true},
		{"no deadlines, declared over the limit, stalls",
			"Content-Length: 1000\r\n\r\nxxxxx", 413, `{"error":"idempotency_body_too_large"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{BodyTimeout: bodyTimeout})
			rt := h.route(RouteConfig{Name: "orders", MaxBodyBytes: 64}, orderHandler)
			var handler http.Handler = rt
			if tt.wrapped {
				handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					rt.ServeHTTP(struct{ http.ResponseWriter }{w}, r)
				})
			}
			srv := httptest.NewUnstartedServer(handler)
			srv.Config.ReadTimeout = time.Minute
			srv.Start()
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close() // before srv.Close: a held connection would block it
			start := time.Now()
			_ = conn.SetDeadline(start.Add(bound))
			_, err = io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
				HeaderKey+": "+testKey+"\r\n"+tt.request)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer %v after the client stalled (body timeout %v): %v", time.Since(start), bodyTimeout, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status || string(got) != tt.body {
				t.Fatalf("answer %d %s, want %d %s", resp.StatusCode, got, tt.status, tt.body)
			}
			if !resp.Close {
				t.Errorf("Connection = %q, want close", resp.Header.Get("Connection"))
			}
			// The server closes its side: the client reads EOF, not its
			// own deadline. (Without deadlines net/http still reads what
			// is left of the body when it closes it, until the client
			// goes or ReadTimeout ends it.)
			if !tt.wrapped {
				if _, err := br.ReadByte(); err != io.EOF {
					t.Errorf("after the answer: %v, want EOF (the server closing the connection)", err)
				}
			}
			if h.store.claims.Load() != 0 || h.calls.Load() != 0 {
				t.Errorf("claims=%d calls=%d, want none", h.store.claims.Load(), h.calls.Load())
			}
		})
	}
}

// stallingBody yields a few bytes and then fails, as a connection does whose
// client declared far more than it sent.
type stallingBody struct{ sent bool }

func (b *stallingBody) Read(p []byte) (int, error) {
	if b.sent {
		return 0, errors.New("client stalled past the body timeout")
	}
	b.sent = true
	return copy(p, `{"qty":1}`), nil
}

func (b *stallingBody) Close() error { return nil }

// TestBodyBufferFollowsArrivingBytes: a request that declares 1 MiB and
// sends a few bytes costs a few bytes of memory, not the declared length:
// readBody used to allocate the declared Content-Length before a byte
// arrived, so connections sending only headers could grow the heap by
// their declared sizes.
func TestBodyBufferFollowsArrivingBytes(t *testing.T) {
	const declared = 1 << 20
	const runs = 50
	for _, length := range []int64{declared, -1} { // declared, and chunked
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range runs {
			r := httptest.NewRequest("POST", "/orders", nil)
			r.Body, r.ContentLength = &stallingBody{}, length
			if _, err := readBody(httptest.NewRecorder(), r, declared, time.Second); err == nil {
				t.Fatal("a body that failed mid-way was read whole")
			}
		}
		runtime.ReadMemStats(&after)
		perRun := (after.TotalAlloc - before.TotalAlloc) / runs
		t.Logf("Content-Length %d: %d bytes allocated per request", length, perRun)
		if perRun > declared/16 {
			t.Errorf("Content-Length %d: %d bytes allocated per request for 9 bytes sent, want far below %d",
				length, perRun, declared)
		}
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
