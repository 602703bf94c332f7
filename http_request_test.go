package idempotency

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestScoping(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	a := h.route(RouteConfig{Name: "a"}, orderHandler)
	b := h.route(RouteConfig{Name: "b"}, orderHandler)
	send(t, a, "POST", "/x", testKey, `{}`, "X-User", "1")
	if w := send(t, a, "POST", "/x", testKey, `{}`, "X-User", "2"); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("user 2 got user 1's replay")
	}
	if w := send(t, b, "POST", "/x", testKey, `{}`, "X-User", "1"); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("endpoint b got endpoint a's replay")
	}
	if w := send(t, a, "POST", "/x", testKey, `{}`, "X-User", "1"); w.Header().Get(HeaderReplayed) != "true" {
		t.Fatal("same user, same endpoint did not replay")
	}
	if h.calls.Load() != 3 {
		t.Fatalf("calls = %d, want 3", h.calls.Load())
	}
}

// TestEndpointNames: the route's name, else the ServeMux pattern, else
// method and path (labelled "unnamed", so two unnamed routes never share
// keys).
func TestEndpointNames(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{account}", h.route(RouteConfig{}, orderHandler))
	send(t, mux, "POST", "/orders/1", testKey, `{}`)
	if counter(t, h.mw.metrics.miss.WithLabelValues("POST /orders/{account}")) != 1 {
		t.Fatal("the ServeMux pattern is not the label")
	}
	unnamed := h.route(RouteConfig{}, orderHandler)
	send(t, unnamed, "POST", "/a", testKey, `{}`)
	if w := send(t, unnamed, "POST", "/b", testKey, `{}`); w.Header().Get(HeaderReplayed) != "" {
		t.Fatal("two unnamed paths shared a key")
	}
	if counter(t, h.mw.metrics.miss.WithLabelValues("unnamed")) != 2 {
		t.Fatal("unnamed routes not labelled unnamed")
	}
	rows, _ := h.store.ExportScope(context.Background(), "")
	var endpoints []string
	for _, r := range rows {
		endpoints = append(endpoints, r.Endpoint)
	}
	if strings.Join(endpoints, "|") != "POST /orders/{account}|POST /a|POST /b" {
		t.Fatalf("stored endpoints %q", endpoints)
	}
}

// TestUnstorableScope: a scope or endpoint the store cannot hold (not
// UTF-8, a NUL byte, over 1 KiB) is refused before any claim, fail-open or
// not, and nothing is stored.
func TestUnstorableScope(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		scope, path string
		fits        bool
	}{
		"InvalidUTF8":  {scope: "tenant-\xff", path: "/billing"},
		"NUL":          {scope: "a\x00b", path: "/billing"},
		"LongScope":    {scope: strings.Repeat("u", maxScopeBytes+1), path: "/billing"},
		"LongPath":     {scope: "42", path: "/" + strings.Repeat("p", maxScopeBytes)},
		"LongestScope": {scope: strings.Repeat("u", maxScopeBytes), path: "/billing", fits: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := NewMemoryStore()
			mw, err := New(store, Config{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Scope: func(context.Context) string { return c.scope }})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			// No Name and no pattern: the endpoint is the method and path.
			rt := mw.MustRoute(RouteConfig{FailOpen: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			w := send(t, rt, "POST", c.path, testKey, `{}`)
			if c.fits {
				if w.Code != 201 || calls.Load() != 1 {
					t.Fatalf("a scope of %d bytes: %d, %d calls; want it run", len(c.scope), w.Code, calls.Load())
				}
				return
			}
			assertJSONError(t, w, 400, `{"error":"idempotency_scope_invalid"}`)
			if calls.Load() != 0 || len(store.rows) != 0 {
				t.Errorf("handler ran %d times, %d rows stored", calls.Load(), len(store.rows))
			}
			if n := testutil.ToFloat64(mw.metrics.rejections.WithLabelValues(unnamedEndpoint, reasonInvalidScope)); n != 1 {
				t.Errorf("rejections{invalid_scope} = %v, want 1", n)
			}
		})
	}
}

// TestBodyCutShort: a client that promises more body than it sends gets
// 400, the key is not claimed, and the whole body then executes. The
// client half-closes its connection after the short body, so it always
// reads the server's answer.
func TestBodyCutShort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	srv := httptest.NewServer(rt)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second)) // never hang
	if _, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"+
		HeaderKey+": "+testKey+"\r\nContent-Length: 100\r\n\r\n{\"a\":"); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the short body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || strings.TrimSpace(string(body)) != `{"error":"idempotency_body_unreadable"}` {
		t.Fatalf("short body answered %d %s", resp.StatusCode, body)
	}
	if h.store.claims.Load() != 0 || h.calls.Load() != 0 ||
		counter(t, h.mw.metrics.rejections.WithLabelValues("orders", "body_unreadable")) != 1 {
		t.Fatalf("claims=%d calls=%d after a short body, or the rejection not counted", h.store.claims.Load(), h.calls.Load())
	}
	w := send(t, rt, "POST", "/", testKey, `{"a":1}`)
	if w.Code != 201 || h.calls.Load() != 1 {
		t.Fatalf("whole body: %d calls %d", w.Code, h.calls.Load())
	}
}

// TestBodyLongerThanDeclared: a body a wrapper replaced without fixing
// Content-Length is read whole, so two different bodies never share a
// hash (and a 422 stays a 422).
func TestBodyLongerThanDeclared(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, orderHandler)
	for i, body := range []string{`{"a":1}`, `{"a":1,"b":2}`} {
		r := httptest.NewRequest("POST", "/r", strings.NewReader(body))
		r.ContentLength = 3 // stale
		r.Header.Set(HeaderKey, testKey)
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		if want := []int{201, 422}[i]; w.Code != want {
			t.Fatalf("body %s: %d, want %d", body, w.Code, want)
		}
	}
}

// TestMaxBodyBytesUnlimited: math.MaxInt64 means no limit. It used to
// overflow the one byte read past the limit, so every chunked body reached
// the handler empty and all of them hashed alike.
func TestMaxBodyBytesUnlimited(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var got []string
	rt := h.route(RouteConfig{Name: "orders", MaxBodyBytes: math.MaxInt64}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
		w.WriteHeader(http.StatusCreated)
	})
	for i, body := range []string{`{"qty":1}`, `{"qty":1000}`} {
		r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader(body))) // no length: chunked
		r.ContentLength = -1
		r.Header.Set(HeaderKey, testKey)
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		if want := []int{201, 422}[i]; w.Code != want {
			t.Fatalf("body %s: %d %s, want %d", body, w.Code, w.Body, want)
		}
	}
	if len(got) != 1 || got[0] != `{"qty":1}` {
		t.Fatalf("the handler saw %q, want the one body whole", got)
	}
}

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

// TestUnstorableScopeFailClosed: a scope the store could not hold is 400
// on a fail-closed route too, before any claim.
func TestUnstorableScopeFailClosed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Scope: func(context.Context) string { return "tenant-\xff" }})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{}`), 400, `{"error":"idempotency_scope_invalid"}`)
	if h.calls.Load() != 0 || h.store.claims.Load() != 0 ||
		counter(t, h.mw.metrics.rejections.WithLabelValues("orders", reasonInvalidScope)) != 1 {
		t.Fatalf("calls %d, claims %d, or the rejection not counted", h.calls.Load(), h.store.claims.Load())
	}
}

// TestReadAllAsIOReadAll: readAll reads what io.ReadAll of a LimitReader
// reads, whatever length is declared (none, exact, short, long), at any
// limit, from readers that return a byte at a time or fail half-way.
func TestReadAllAsIOReadAll(t *testing.T) {
	t.Parallel()
	errStall := errors.New("stalled")
	for _, size := range []int{0, 1, 39, 511, 512, 513, 2000} {
		body := strings.Repeat("x", size)
		for _, declared := range []int64{-1, int64(size), int64(size / 2), int64(size + 7)} {
			for _, limit := range []int64{int64(size) + 1, int64(size), int64(size / 2), 0} {
				readers := map[string]func() io.Reader{
					"plain":    func() io.Reader { return strings.NewReader(body) },
					"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
					"fails":    func() io.Reader { return io.MultiReader(strings.NewReader(body), iotest.ErrReader(errStall)) },
				}
				for name, reader := range readers {
					want, wantErr := io.ReadAll(io.LimitReader(reader(), limit))
					got, err := readAll(reader(), limit, declared)
					if string(got) != string(want) || !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
						t.Errorf("%s body of %d, declared %d, limit %d: read %d bytes, %v; io.ReadAll %d, %v",
							name, size, declared, limit, len(got), err, len(want), wantErr)
					}
				}
			}
		}
	}
}
