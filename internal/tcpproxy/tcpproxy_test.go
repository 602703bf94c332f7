package tcpproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/tcpproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roundTrip sends a line on c and reads it back within d.
func roundTrip(c net.Conn, r *bufio.Reader, d time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return errors.New("echoed " + line)
	}
	return nil
}

func dial(t *testing.T, p *tcpproxy.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestProxy(t *testing.T) {
	t.Parallel()
	p := tcpproxy.New(t, echo(t))
	const wait = 5 * time.Second

	c, r := dial(t, p)
	if err := roundTrip(c, r, wait); err != nil {
		t.Fatalf("forwarding: %v", err)
	}

	p.Cut()
	if err := roundTrip(c, r, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("live connection after Cut: %v, want it closed", err)
	}
	c2, r2 := dial(t, p)
	if err := roundTrip(c2, r2, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection after Cut: %v, want it closed", err)
	}

	p.Restore()
	c3, r3 := dial(t, p)
	if err := roundTrip(c3, r3, wait); err != nil {
		t.Fatalf("after Restore: %v", err)
	}

	p.Blackhole()
	if err := roundTrip(c3, r3, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("live connection in a black hole: %v, want a timeout", err)
	}
	c4, r4 := dial(t, p)
	if err := roundTrip(c4, r4, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection in a black hole: %v, want a timeout", err)
	}

	p.Restore()
	c5, r5 := dial(t, p)
	if err := roundTrip(c5, r5, wait); err != nil {
		t.Fatalf("after the second Restore: %v", err)
	}

	p.Close()
	p.Close() // idempotent
	if err := roundTrip(c5, r5, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection after Close: %v, want it closed", err)
	}
}

// TestDropReplyTo: the line that matches reaches the target, its echo is
// lost and the connection closed; other lines pass, and Restore ends it.
func TestDropReplyTo(t *testing.T) {
	t.Parallel()
	p := tcpproxy.New(t, echo(t))
	const wait = 5 * time.Second
	c, r := dial(t, p)
	p.DropReplyTo("PIN", 0) // not a word of "ping": passes
	if err := roundTrip(c, r, wait); err != nil {
		t.Fatalf("a line with the bytes inside a word: %v", err)
	}
	p.DropReplyTo("PING", 0)
	if err := roundTrip(c, r, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a line that matches: %v, want its reply lost and the connection closed", err)
	}
	c2, r2 := dial(t, p) // a new connection is muted too
	if err := roundTrip(c2, r2, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a new connection's line that matches: %v, want it closed", err)
	}
	p.Restore()
	c3, r3 := dial(t, p)
	if err := roundTrip(c3, r3, wait); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	p.DropReplyTo("ping", 1) // the read after the match loses its reply
	if err := roundTrip(c3, r3, wait); err != nil {
		t.Fatalf("the line that arms: %v, want its echo", err)
	}
	if err := roundTrip(c3, r3, wait); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the line after the match: %v, want its reply lost and the connection closed", err)
	}
}
