// Package lossyproxy is an HTTP proxy that loses what a bad network loses,
// for the client's tests and the client example: it can drop a request
// before it reaches the server, lose the answer after the server has
// answered (so whatever the server did is committed), cut the answer
// part-way through its head or its body, or hold the answer back for a
// while.
package lossyproxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is what the proxy does to one request.
type Fault int

// The faults.
const (
	Pass        Fault = iota // forward the request and the answer
	DropRequest              // close the client's connection; the server never sees the request
	DropAnswer               // forward, wait for the whole answer, then close the client's connection without a byte
	CutAnswer                // forward, then send the first bytes of the answer's status line and close
	Delay                    // forward, then hold the answer back for Proxy.Delay
	CutBody                  // forward, then send the answer's head (with its whole Content-Length) and half of its body, and close
)

func (f Fault) String() string {
	switch f {
	case Pass:
		return "pass"
	case DropRequest:
		return "dropped the request"
	case DropAnswer:
		return "lost the answer"
	case CutAnswer:
		return "cut the answer"
	case Delay:
		return "delayed the answer"
	case CutBody:
		return "cut the answer's body"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Proxy is an http.Handler that forwards every request to Target and
// applies the Fault that Plan picks. It is safe for concurrent use; its
// fields must not change once it serves.
type Proxy struct {
	// Target is the server's base URL (scheme and host).
	Target *url.URL
	// Plan picks the fault for the n-th request (from 1). Nil: Pass.
	Plan func(n int, r *http.Request) Fault
	// Delay is how long Delay holds an answer back.
	Delay time.Duration
	// Transport sends the requests to Target. Defaults to a transport of
	// the proxy's own, closed by Close.
	Transport http.RoundTripper
	// OnFault, when set, is called for each request once its fault is
	// decided and before the client sees anything, with the server's status
	// (0 when the server never answered: the request was dropped, or the
	// client or the server went away).
	OnFault func(n int, r *http.Request, f Fault, status int)

	once sync.Once
	own  *http.Transport
	mu   sync.Mutex
	n    int
}

// Close closes the idle connections of the proxy's own transport.
func (p *Proxy) Close() {
	p.init()
	p.own.CloseIdleConnections()
}

func (p *Proxy) init() {
	p.once.Do(func() { p.own = &http.Transport{MaxIdleConnsPerHost: 64} })
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.init()
	p.mu.Lock()
	p.n++
	n := p.n
	p.mu.Unlock()
	f := Pass
	if p.Plan != nil {
		f = p.Plan(n, r)
	}
	note := func(status int) {
		if p.OnFault != nil {
			p.OnFault(n, r, f, status)
		}
	}
	if f == DropRequest {
		note(0)
		hangUp(w)
		return
	}
	resp, body, err := p.forward(r)
	if err != nil {
		note(0)
		http.Error(w, "lossyproxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	// Noted before the client can see anything, so that what a client
	// saw was always noted first.
	note(resp.StatusCode)
	switch f {
	case DropAnswer:
		hangUp(w)
		return
	case CutAnswer:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			line := fmt.Sprintf("HTTP/1.1 %d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
			_, _ = io.WriteString(c, line[:len(line)/2])
			c.Close()
		}
		return
	case CutBody:
		cutBody(w, resp, body)
		return
	case Delay:
		timer := time.NewTimer(p.Delay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return
		}
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

// forward sends r to Target and reads the whole answer.
func (p *Proxy) forward(r *http.Request) (*http.Response, []byte, error) {
	reqBody, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, nil, err
	}
	u := *p.Target
	u.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
	u.RawPath, u.RawQuery = "", r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), bytes.NewReader(reqBody))
	if err != nil {
		return nil, nil, err
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Connection")
	rt := p.Transport
	if rt == nil {
		rt = p.own
	}
	resp, err := rt.RoundTrip(out)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	resp.Header.Del("Content-Length")
	resp.Header.Del("Connection")
	return resp, body, nil
}

// cutBody sends resp's head, declaring body's whole length, then the first
// half of body, and closes the client's connection: the client reads a
// complete head and a body that ends early.
func cutBody(w http.ResponseWriter, resp *http.Response, body []byte) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	h := resp.Header.Clone()
	h.Set("Content-Length", strconv.Itoa(len(body)))
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	_ = h.Write(&head)
	head.WriteString("\r\n")
	head.Write(body[:len(body)/2])
	_, _ = c.Write(head.Bytes())
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}
