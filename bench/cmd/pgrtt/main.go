// Command pgrtt is a PostgreSQL proxy on loopback that counts database round
// trips: it reads the server's side of the wire protocol and counts
// ReadyForQuery messages, one per client round trip (a simple query, or an
// extended-protocol Sync), and those that leave the session idle, one per
// finished transaction (an autocommit statement, a COMMIT or a ROLLBACK; a
// pool's ping counts too). GET /counts on -http answers the totals as JSON.
//
// Put it between the example server and Postgres for a short run, then
// divide by the requests sent (loadgen -rtt-url does): the proxy adds a hop,
// so measure throughput without it.
//
// It accepts and dials loopback addresses only, refuses SSL and GSS
// encryption (sslmode=disable or prefer), and exits by itself after
// -lifetime.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idempotency/bench/internal/result"
)

var roundTrips, xacts, conns atomic.Int64

func main() {
	listen := flag.String("listen", "127.0.0.1:15432", "proxy address (loopback only)")
	upstream := flag.String("upstream", "127.0.0.1:5432", "PostgreSQL address (loopback only)")
	httpAddr := flag.String("http", "127.0.0.1:15433", "counters address: GET /counts (loopback only)")
	lifetime := flag.Duration("lifetime", 15*time.Minute, "exit after this long, whatever happens")
	flag.Parse()
	for _, a := range []string{*listen, *upstream, *httpAddr} {
		host, _, err := net.SplitHostPort(a)
		if err == nil {
			err = result.CheckHost(host)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgrtt:", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *lifetime)
	defer cancel()
	if err := run(ctx, *listen, *upstream, *httpAddr); err != nil {
		fmt.Fprintln(os.Stderr, "pgrtt:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, listen, upstream, httpAddr string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	hln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{
			"round_trips": roundTrips.Load(), "xacts": xacts.Load(), "conns": conns.Load(),
		})
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hln) }()
	go func() {
		<-ctx.Done()
		ln.Close()
		_ = hs.Close()
	}()
	fmt.Printf("pgrtt: proxy %s -> %s, counters http://%s/counts\n", ln.Addr(), upstream, hln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go serve(ctx, c, upstream)
	}
}

// Request codes of the untyped messages a client may send first.
const (
	codeCancel = 80877102
	codeSSL    = 80877103
	codeGSS    = 80877104
)

// serve proxies one client connection.
func serve(ctx context.Context, client net.Conn, upstream string) {
	defer client.Close()
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	var first []byte
	for {
		msg, err := readUntyped(client)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == codeSSL || code == codeGSS {
			if _, err := client.Write([]byte{'N'}); err != nil { // no encryption: the client goes on in plain text
				return
			}
			continue
		}
		first = msg
		break
	}
	server, err := result.DialLoopback(ctx, "tcp", upstream)
	if err != nil {
		return
	}
	defer server.Close()
	_ = client.SetDeadline(time.Time{})
	if _, err := server.Write(first); err != nil {
		return
	}
	if binary.BigEndian.Uint32(first[4:8]) == codeCancel {
		return
	}
	conns.Add(1)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(server, client)
		closeWrite(server)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, &counter{r: server})
		closeWrite(client)
		done <- struct{}{}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// readUntyped reads one length-prefixed message without a type byte (the
// startup packet and its kin).
func readUntyped(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > 10000 {
		return nil, errors.New("bad startup packet length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// counter passes the server's stream through, parsing message frames to
// count ReadyForQuery ('Z') messages and their transaction status.
type counter struct {
	r     io.Reader
	hdr   [5]byte
	hn    int  // header bytes held
	left  int  // body bytes of the current message still to pass
	typ   byte // current message type
	fresh bool // no body byte of the current message seen yet
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.feed(p[:n])
	return n, err
}

func (c *counter) feed(b []byte) {
	for len(b) > 0 {
		if c.left > 0 {
			if c.fresh && c.typ == 'Z' && b[0] == 'I' {
				xacts.Add(1)
			}
			c.fresh = false
			k := min(c.left, len(b))
			c.left -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.hn:], b)
		c.hn += k
		b = b[k:]
		if c.hn < len(c.hdr) {
			continue
		}
		c.hn = 0
		c.typ = c.hdr[0]
		c.left = int(binary.BigEndian.Uint32(c.hdr[1:])) - 4
		c.fresh = true
		if c.typ == 'Z' {
			roundTrips.Add(1)
		}
	}
}
