// Package tcpproxy is a TCP proxy for outage tests: put it between a client
// and a server, then cut the link (connections refused) or black-hole it
// (connections accepted but nothing forwarded, so clients wait until their
// deadline), and restore it.
package tcpproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// mode is what the proxy does with traffic.
type mode int

const (
	forwarding  mode = iota // pass bytes both ways
	refusing                // close every connection at once
	blackholing             // accept, read and discard; never answer
)

// Proxy forwards TCP connections from a local address to a target.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu        sync.Mutex
	mode      mode
	closed    bool
	links     map[*link]struct{}
	accepted  int64  // connections accepted, whatever the mode
	muteOn    []byte // set by DropReplyTo: lower-case bytes from a client that arm its link
	muteAfter int    // set by DropReplyTo: client writes after the one that armed, before the mute
}

// link is one client connection and, when forwarding, its upstream one.
type link struct {
	client, upstream net.Conn // upstream is nil for a black-holed connection
	discard          bool     // set once the link was black-holed: bytes are dropped
	mute             bool     // set by DropReplies: the next bytes from upstream are dropped and the link closed
	armed            bool     // DropReplyTo's match was seen; countdown client reads remain before mute
	countdown        int
}

func (l *link) close() {
	l.client.Close()
	if l.upstream != nil {
		l.upstream.Close()
	}
}

// New starts a proxy to target (host:port) listening on 127.0.0.1 on a free
// port, and closes it when the test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("tcpproxy: listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the address clients connect to, as host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted returns how many connections the proxy has accepted since it
// started, in every mode: the dials clients made through it.
func (p *Proxy) Accepted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Cut closes every live connection and, until Restore, closes each new one
// as soon as it is accepted: clients see the connection refused or reset.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = refusing
	for l := range p.links {
		l.close()
		delete(p.links, l)
	}
}

// Blackhole stops forwarding: live connections stay open but what is sent
// on them is dropped, and new connections are accepted but never reach the
// target, so clients wait for answers until their own deadlines. Restore
// closes the connections black-holed this way, whose streams are broken.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = blackholing
	for l := range p.links {
		l.discard = true
	}
}

// DropReplies makes every live connection lose what the target sends next:
// those bytes are dropped and the connection closed, so the client's
// request reached the target (a COMMIT committed) but its reply was lost.
// New connections are not affected.
func (p *Proxy) DropReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.mute = true
	}
}

// DropReplyTo makes every connection, live or new, lose the reply to the
// first bytes its client sends that contain match as a word (ASCII, any
// case, neither preceded nor followed by a letter, digit or '_'), or with
// after > 0 to the after-th read of the client's bytes that follows them:
// those bytes reach the target, and what the target sends next is dropped
// and the connection closed. DropReplyTo("commit", 0) loses a COMMIT's
// reply after the COMMIT committed; after 1 suits a client that prepares
// the statement first and then executes it by name (pgx's statement
// cache). Restore ends it.
func (p *Proxy) DropReplyTo(match string, after int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muteOn, p.muteAfter = bytes.ToLower([]byte(match)), after
}

// Restore forwards new connections again, after closing those that Cut or
// Blackhole broke.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = forwarding
	p.muteOn = nil
	for l := range p.links {
		if l.discard {
			l.close()
			delete(p.links, l)
		}
	}
}

// Close stops the proxy: it closes the listener and every connection, and
// returns once all of the proxy's goroutines have ended. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.ln.Close()
		for l := range p.links {
			l.close()
			delete(p.links, l)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// accept serves the listener until it is closed.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		m, closed := p.mode, p.closed
		p.accepted++
		p.mu.Unlock()
		switch {
		case closed || m == refusing:
			c.Close()
		case m == blackholing:
			l := &link{client: c, discard: true}
			if p.track(l) {
				p.wg.Add(1)
				go p.drain(l)
			}
		default:
			p.wg.Add(1)
			go p.dial(c)
		}
	}
}

// dialTimeout bounds connecting to the target.
const dialTimeout = 5 * time.Second

// dial connects c to the target and starts forwarding.
func (p *Proxy) dial(c net.Conn) {
	defer p.wg.Done()
	u, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, upstream: u}
	if !p.track(l) {
		return
	}
	p.wg.Add(2)
	go p.pipe(l, u, c, false)
	go p.pipe(l, c, u, true)
}

// track registers l, unless the proxy closed or started refusing meanwhile,
// in which case it closes l and reports false.
func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == refusing {
		l.close()
		return false
	}
	if p.mode == blackholing {
		l.discard = true
	}
	p.links[l] = struct{}{}
	return true
}

// untrack forgets l and closes it.
func (p *Proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// pipe copies src to dst until either fails, dropping what it reads while
// l is black-holed; fromUpstream: src is the target, whose bytes a muted
// link drops before it closes.
func (p *Proxy) pipe(l *link, dst io.Writer, src io.Reader, fromUpstream bool) {
	defer p.wg.Done()
	defer p.untrack(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if !fromUpstream && p.muteOn != nil {
				p.arm(l, buf[:n]) // before the bytes leave, so their reply cannot pass first
			}
			discard, mute := l.discard, l.mute && fromUpstream
			p.mu.Unlock()
			if mute {
				return // untrack closes the link
			}
			if !discard {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// drain reads and drops what a black-holed client sends until it is closed.
func (p *Proxy) drain(l *link) {
	defer p.wg.Done()
	defer p.untrack(l)
	_, _ = io.Copy(io.Discard, l.client)
}

// arm counts DropReplyTo's reads on l, whose client sent b, and mutes l
// at the read it names. Called with p.mu held.
func (p *Proxy) arm(l *link, b []byte) {
	switch {
	case l.armed:
		l.countdown--
	case containsWord(bytes.ToLower(b), p.muteOn):
		l.armed, l.countdown = true, p.muteAfter
	default:
		return
	}
	if l.countdown == 0 {
		l.mute = true
	}
}

// containsWord reports whether b holds w neither preceded nor followed by
// a letter, digit or '_' (so "commit" is not found in
// "synchronous_commit" or "committed").
func containsWord(b, w []byte) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], w)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(w)
		if (start == 0 || !wordByte(b[start-1])) && (end == len(b) || !wordByte(b[end])) {
			return true
		}
		i = start + 1
	}
}

func wordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
