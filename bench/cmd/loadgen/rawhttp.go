package main

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idempotency/bench/internal/result"
)

// rawClient is the steady modes' HTTP client: one keep-alive HTTP/1.1
// connection to the loopback -url, one request serialised once, with only
// the Idempotency-Key rewritten in place per request, and answers parsed
// just enough to keep the status and the replay marker and to find the
// body's end. In steady state a request allocates nothing, so the client's
// own CPU (cpu_loadgen_us) stays small beside the server's it measures:
// net/http's client spends 60-120µs per request on the same cores.
//
// It is not safe for concurrent use: each worker takes one at a time.
type rawClient struct {
	addr    string // host:port, dialled through result.LoopbackDialer only
	timeout time.Duration
	req     []byte        // the whole request: line, headers and body
	keyAt   int           // offset of the key's 36 characters in req; -1 without a key
	fresh   bool          // a new key for every request (mode unique)
	rng     *rand.ChaCha8 // the fresh keys, seeded from crypto/rand
	hexKey  [16]byte

	conn    net.Conn
	br      *bufio.Reader
	reused  bool            // conn has carried a whole exchange
	watched context.Context // the context whose end cuts conn
	unwatch func() bool
}

// keyLen is the length of a key as newKey writes it: a UUID.
const keyLen = 36

var errMalformed = errors.New("malformed HTTP response")

// newRawClient prepares POST base+path with body, the session token when
// there is one, and key: "" for none, "fresh" rewritten (fresh) per
// request, or one fixed key. The headers are those net/http's client sent
// before, so the server's work per request is what it was.
func newRawClient(base, path, token string, body []byte, key string, fresh bool, timeout time.Duration) (*rawClient, error) {
	u, err := result.CheckURL(base + path)
	if err != nil {
		return nil, err
	}
	target := u.RequestURI()
	if strings.ContainsAny(target, " \r\n") || strings.ContainsAny(u.Host, " \r\n") {
		return nil, fmt.Errorf("%q: not usable on a request line", base+path)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	c := &rawClient{addr: addr, timeout: timeout, keyAt: -1, fresh: fresh}
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: %d\r\n", target, u.Host, len(body))
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	b.WriteString("Content-Type: application/json\r\n")
	if fresh || key != "" {
		if fresh {
			key = strings.Repeat("0", keyLen)
			var seed [32]byte
			_, _ = crand.Read(seed[:])
			c.rng = rand.NewChaCha8(seed)
		}
		if strings.ContainsAny(key, "\r\n") {
			return nil, errors.New("a key with a line break")
		}
		b.WriteString("Idempotency-Key: ")
		c.keyAt = b.Len()
		b.WriteString(key)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	c.req = b.Bytes()
	return c, nil
}

// newFreshKey writes a new random (version 4) UUID over the request's key.
func (c *rawClient) newFreshKey() {
	const hexDigits = "0123456789abcdef"
	b := &c.hexKey
	x, y := c.rng.Uint64(), c.rng.Uint64()
	for i := range 8 {
		b[i], b[8+i] = byte(x>>(8*i)), byte(y>>(8*i))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	dst := c.req[c.keyAt : c.keyAt+keyLen]
	j := 0
	for i, v := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = hexDigits[v>>4], hexDigits[v&0x0f]
		j += 2
	}
}

// do sends the request (with a new key in mode unique) and reads its
// answer. As net/http's client did, a request that has a key, or was not
// sent at all, is sent once more on a new connection when a reused one
// turns out closed before any byte of the answer came back.
func (c *rawClient) do(ctx context.Context) (answer, error) {
	if c.fresh {
		c.newFreshKey()
	}
	a, retry, err := c.roundTrip(ctx)
	if retry {
		a, _, err = c.roundTrip(ctx)
	}
	return a, err
}

// roundTrip is one attempt; retry says whether a failed one may be sent
// again.
func (c *rawClient) roundTrip(ctx context.Context) (a answer, retry bool, err error) {
	if err := ctx.Err(); err != nil {
		return a, false, err
	}
	if c.conn == nil {
		if err := c.dial(ctx); err != nil {
			return a, false, err
		}
	}
	c.watch(ctx)
	reused := c.reused
	_ = c.conn.SetDeadline(time.Now().Add(c.timeout))
	if err := ctx.Err(); err != nil { // ended before the deadline was set: watch may have run
		c.drop()
		return a, false, err
	}
	if _, err := c.conn.Write(c.req); err != nil {
		c.drop()
		return a, reused && !timedOut(ctx, err), fmt.Errorf("write request: %w", err)
	}
	a, keep, got, err := c.readAnswer()
	if err != nil {
		c.drop()
		return a, reused && !got && c.keyAt >= 0 && !timedOut(ctx, err), fmt.Errorf("read answer: %w", err)
	}
	if keep {
		c.reused = true
	} else {
		c.drop()
	}
	return a, false, nil
}

func timedOut(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded)
}

func (c *rawClient) dial(ctx context.Context) error {
	conn, err := result.LoopbackDialer(5*time.Second).DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	c.conn, c.reused = conn, false
	if c.br == nil {
		c.br = bufio.NewReaderSize(conn, 8<<10)
	} else {
		c.br.Reset(conn)
	}
	return nil
}

// watch makes the end of ctx cut the connection's reads and writes short.
func (c *rawClient) watch(ctx context.Context) {
	if c.unwatch != nil && c.watched == ctx {
		return
	}
	if c.unwatch != nil {
		c.unwatch()
	}
	conn := c.conn
	c.watched = ctx
	c.unwatch = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
}

// drop closes the connection; the next request dials a new one.
func (c *rawClient) drop() {
	if c.conn == nil {
		return
	}
	if c.unwatch != nil {
		c.unwatch()
		c.unwatch, c.watched = nil, nil
	}
	_ = c.conn.Close()
	c.conn, c.reused = nil, false
}

func (c *rawClient) close() { c.drop() }

// readAnswer reads one whole answer (skipping interim 1xx ones): keep says
// the connection can carry the next request, got that some of an answer
// came back.
func (c *rawClient) readAnswer() (a answer, keep, got bool, err error) {
	for {
		h, n, err := c.readHead()
		if err != nil {
			return a, false, got || n > 0, err
		}
		got = true
		if h.status >= 100 && h.status < 200 && h.status != 101 {
			continue
		}
		a = answer{status: h.status, replayed: h.replayed}
		keep = !h.close
		switch {
		case h.status < 200 || h.status == 204 || h.status == 304:
		case h.chunked:
			err = c.skipChunked()
		case h.length >= 0:
			_, err = c.br.Discard(int(h.length))
		default: // the body runs to the connection's end
			_, err = c.br.WriteTo(io.Discard)
			keep = false
		}
		return a, keep, got, err
	}
}

// head is what readHead keeps of an answer's status line and headers.
type head struct {
	status   int
	length   int64 // Content-Length; -1 without one
	chunked  bool
	close    bool // the server closes the connection after this answer
	replayed bool // Idempotent-Replayed: true
}

// readHead reads the status line and the headers; n counts the bytes read.
func (c *rawClient) readHead() (h head, n int, err error) {
	line, err := c.br.ReadSlice('\n')
	n = len(line)
	if err != nil {
		return h, n, err
	}
	line = trimEOL(line)
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return h, n, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	for _, d := range line[9:12] {
		if d < '0' || d > '9' {
			return h, n, fmt.Errorf("%w: status line %q", errMalformed, line)
		}
		h.status = h.status*10 + int(d-'0')
	}
	http10 := line[7] == '0'
	keepAlive, sawReplayed := false, false
	h.length = -1
	for {
		line, err := c.br.ReadSlice('\n')
		n += len(line)
		if errors.Is(err, bufio.ErrBufferFull) {
			// A header longer than the buffer: none loadgen reads.
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = c.br.ReadSlice('\n')
				n += len(line)
			}
			if err != nil {
				return h, n, err
			}
			continue
		}
		if err != nil {
			return h, n, err
		}
		line = trimEOL(line)
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return h, n, fmt.Errorf("%w: header %q", errMalformed, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			v, ok := parseUint(value, 10)
			if !ok || (h.length >= 0 && v != h.length) {
				return h, n, fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
			h.length = v
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(value, []byte("chunked")) {
				return h, n, fmt.Errorf("%w: unsupported Transfer-Encoding %q", errMalformed, value)
			}
			h.chunked = true
		case bytes.EqualFold(name, []byte("Connection")):
			h.close = h.close || hasToken(value, "close")
			keepAlive = keepAlive || hasToken(value, "keep-alive")
		case bytes.EqualFold(name, []byte("Idempotent-Replayed")):
			if !sawReplayed { // as net/http's Header.Get: the first value
				h.replayed, sawReplayed = string(value) == "true", true
			}
		}
	}
	if http10 && !keepAlive {
		h.close = true
	}
	if h.chunked {
		h.length = -1
	}
	return h, n, nil
}

// skipChunked reads a chunked body and its trailers to their end.
func (c *rawClient) skipChunked() error {
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = trimEOL(line)
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		size, ok := parseUint(bytes.TrimSpace(line), 16)
		if !ok {
			return fmt.Errorf("%w: chunk size %q", errMalformed, line)
		}
		if size == 0 {
			break
		}
		if _, err := c.br.Discard(int(size)); err != nil {
			return err
		}
		crlf, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(trimEOL(crlf)) != 0 {
			return fmt.Errorf("%w: no line end after a chunk", errMalformed)
		}
	}
	for { // trailers, up to the empty line
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(trimEOL(line)) == 0 {
			return nil
		}
	}
}

// parseUint parses a decimal or hexadecimal number of at most 15 digits
// (so it fits an int64), without a sign.
func parseUint(b []byte, base int64) (int64, bool) {
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var v int64
	for _, d := range b {
		var x int64
		switch {
		case d >= '0' && d <= '9':
			x = int64(d - '0')
		case base == 16 && d|0x20 >= 'a' && d|0x20 <= 'f':
			x = int64(d|0x20-'a') + 10
		default:
			return 0, false
		}
		v = v*base + x
	}
	return v, true
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// hasToken reports whether the comma-separated list v holds token, in any
// case.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var t []byte
		t, v, _ = bytes.Cut(v, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(t), []byte(token)) {
			return true
		}
	}
	return false
}
