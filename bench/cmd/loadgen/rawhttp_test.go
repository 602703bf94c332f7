package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestRawClientAgainstNetHTTP: against net/http's server, the raw client
// sends the route, body and headers net/http's client sent, a new
// well-formed key each time, all on one connection, and reads the status
// and the replay marker.
func TestRawClientAgainstNetHTTP(t *testing.T) {
	var (
		mu    sync.Mutex
		keys  = map[string]bool{}
		conns atomic.Int64
		bad   []string
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/x/noop" || r.URL.RawQuery != "q=1":
			bad = append(bad, "request line "+r.Method+" "+r.RequestURI)
		case string(b) != `{"n":1}` || r.ContentLength != 7:
			bad = append(bad, "body "+string(b))
		case r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("Content-Type") != "application/json":
			bad = append(bad, "headers")
		case !uuidV4.MatchString(key) || keys[key]:
			bad = append(bad, "key "+key)
		}
		n := len(keys)
		keys[key] = true
		mu.Unlock()
		if n%2 == 1 {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	c, err := newRawClient(srv.URL, "/x/noop?q=1", "tok", []byte(`{"n":1}`), "", true, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for i := range 50 {
		a, err := c.do(context.Background())
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if a.status != http.StatusCreated || a.replayed != (i%2 == 1) {
			t.Errorf("request %d: %+v, want 201 replayed %v", i, a, i%2 == 1)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 || len(keys) != 50 {
		t.Errorf("%d distinct keys, problems %v", len(keys), bad)
	}
	if conns.Load() != 1 {
		t.Errorf("%d connections for 50 requests, want 1", conns.Load())
	}
}

// rawServer is a TCP server that reads requests with net/http's parser
// and writes whatever answer(n) says for the n-th request (from 1), byte
// for byte; an answer of "" cuts the connection without answering, one
// ending in cut is written (up to cut) and then the connection is cut.
type rawServer struct {
	addr  string
	conns atomic.Int64
	keys  chan string // each request's Idempotency-Key, in order
}

func startRaw(t *testing.T, answer func(n int64) string) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{addr: "http://" + ln.Addr().String(), keys: make(chan string, 100)}
	var (
		reqs atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		open []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			mu.Lock()
			open = append(open, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					s.keys <- req.Header.Get("Idempotency-Key")
					out, cutAfter := strings.CutSuffix(answer(reqs.Add(1)), cut)
					if _, err := io.WriteString(conn, out); err != nil || out == "" || cutAfter {
						return
					}
				}
			})
		}
	})
	return s
}

const (
	cut      = "\x00cut"
	created  = "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
	replayed = "HTTP/1.1 201 Created\r\nidempotent-replayed:  true \r\nTransfer-Encoding: chunked\r\n\r\n" +
		"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: 1\r\n\r\n"
	closing = "HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 3\r\n\r\nno!"
)

// TestRawClientAnswers: chunked bodies, interim 1xx answers, bodies to the
// connection's end and Connection: close all leave the client in step with
// the server, reconnecting when the server closes.
func TestRawClientAnswers(t *testing.T) {
	script := []struct {
		out    string
		status int
		replay bool
	}{
		{created, 201, false},
		{replayed, 201, true},
		{"HTTP/1.1 100 Continue\r\n\r\n" + created, 201, false},
		{closing, 409, false},
		{created, 201, false},
		{"HTTP/1.0 503 Service Unavailable\r\nIdempotent-Replayed: true\r\nIdempotent-Replayed: false\r\n\r\nbusy, to the end" + cut, 503, true},
		{"HTTP/1.1 204 No Content\r\n\r\n", 204, false},
		{replayed, 201, true},
	}
	srv := startRaw(t, func(n int64) string { return script[n-1].out })
	c, err := newRawClient(srv.addr, "/", "", []byte("{}"), "k1", false, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for i, want := range script {
		a, err := c.do(context.Background())
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if a.status != want.status || a.replayed != want.replay {
			t.Errorf("answer %d: %+v, want status %d replayed %v", i, a, want.status, want.replay)
		}
		if k := <-srv.keys; k != "k1" {
			t.Errorf("request %d carried key %q, want the fixed k1", i, k)
		}
	}
	// A new connection after the Connection: close and after the HTTP/1.0
	// answer, none otherwise.
	if n := srv.conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// TestRawClientCutConnection: a connection cut before any answer fails a
// request on a new connection; on a reused one, a request with a key is
// sent once more on a new connection (as net/http's client does), one
// without a key is not.
func TestRawClientCutConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     string
		answers []string
		wantErr []bool
		conns   int64
	}{
		{"fresh connection", "k", []string{""}, []bool{true}, 1},
		{"reused, with a key", "k", []string{created, "", created}, []bool{false, false}, 2},
		{"reused, no key", "", []string{created, "", created}, []bool{false, true, false}, 2},
		{"cut mid-answer", "k", []string{created, "HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{" + cut, created}, []bool{false, true, false}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRaw(t, func(n int64) string {
				if int(n) > len(tc.answers) {
					return "" // a request too many: cut
				}
				return tc.answers[n-1]
			})
			c, err := newRawClient(srv.addr, "/", "", nil, tc.key, false, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			for i, wantErr := range tc.wantErr {
				a, err := c.do(context.Background())
				if (err != nil) != wantErr {
					t.Errorf("request %d: %+v, err %v; want an error: %v", i, a, err, wantErr)
				}
				if err == nil && a.status != 201 {
					t.Errorf("request %d: status %d", i, a.status)
				}
			}
			if n := srv.conns.Load(); n != tc.conns {
				t.Errorf("%d connections, want %d", n, tc.conns)
			}
		})
	}
}

// TestRawClientMalformed: what is not an HTTP/1.x answer is an error, and
// the next request starts on a new connection.
func TestRawClientMalformed(t *testing.T) {
	for _, bad := range []string{
		"SSH-2.0-OpenSSH\r\n\r\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 201 Created\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
		"HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip\r\n\r\n",
		"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"HTTP/1.1 201 Created\r\nno colon\r\n\r\n",
	} {
		srv := startRaw(t, func(n int64) string {
			if n == 1 {
				return bad
			}
			return created
		})
		c, err := newRawClient(srv.addr, "/", "", nil, "", false, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if a, err := c.do(context.Background()); err == nil {
			t.Errorf("%q: answer %+v, want an error", bad, a)
		}
		if a, err := c.do(context.Background()); err != nil || a.status != 201 {
			t.Errorf("%q, then: %+v, %v; want a 201", bad, a, err)
		}
		if n := srv.conns.Load(); n != 2 {
			t.Errorf("%q: %d connections, want 2", bad, n)
		}
		c.close()
	}
}

// TestRawClientEnds: a request whose server never answers ends with its
// context, or at the client's timeout.
func TestRawClientEnds(t *testing.T) {
	never := make(chan struct{})
	srv := startRaw(t, func(int64) string { <-never; return "" })
	t.Cleanup(func() { close(never) }) // before startRaw's cleanup waits

	c, err := newRawClient(srv.addr, "/", "", nil, "k", false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-srv.keys // the request arrived: now cancel it
		cancel()
	}()
	if _, err := c.do(ctx); err == nil {
		t.Error("a cancelled request succeeded")
	}

	c2, err := newRawClient(srv.addr, "/", "", nil, "k", false, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.close()
	if _, err := c2.do(context.Background()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("err %v, want the timeout", err)
	}
}

// TestRawClientAllocs: against a server that allocates nothing either, a
// request in steady state allocates nothing (keys included).
func TestRawClientAllocs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 4096)
		out := []byte(replayed)
		for {
			// The client sends a request and waits for its answer: one
			// read holds one whole small request.
			if _, err := conn.Read(buf); err != nil {
				return
			}
			if _, err := conn.Write(out); err != nil {
				return
			}
		}
	}()
	c, err := newRawClient("http://"+ln.Addr().String(), "/noop", "tok", []byte(`{"n":1}`), "", true, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	ctx := context.Background()
	var failed error
	allocs := testing.AllocsPerRun(200, func() {
		if a, err := c.do(ctx); err != nil || !a.replayed {
			failed = err
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Errorf("%.1f allocations per request, want 0", allocs)
	}
}
