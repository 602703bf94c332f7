package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// httpRequest is one HTTP request on its way through a route: the
// engine's call, and the adapter's side of it (the transport), which
// writes the engine's decisions to the response.
type httpRequest struct {
	request
	rt   *route
	w    http.ResponseWriter
	r    *http.Request
	hctx requestContext // the hooks' context, carrying the request (hookContext)
	// Set by handle:
	buf    *responseBuffer
	before http.Header // a held (transactional) run: the headers set before the handler ran
}

func (rt *route) newRequest(w http.ResponseWriter, r *http.Request) *httpRequest {
	rq := &httpRequest{rt: rt, w: w, r: r}
	rq.request = request{policy: &rt.policy, m: rt.m, ctx: r.Context(), t: rq, adapter: "http", start: rt.m.startClock()}
	return rq
}

// endpoint returns the key's scope_endpoint and the metrics label of rq.
func (rt *route) endpoint(rq *httpRequest) (endpoint, label string) {
	r := rq.r
	name := rt.name
	if name == "" && rt.m.cfg.RouteName != nil {
		name = rt.m.cfg.RouteName(rq.hookContext(true))
	}
	if name == "" {
		name = r.Pattern
	}
	if name == "" {
		return r.Method + " " + r.URL.EscapedPath(), unnamedEndpoint
	}
	return name, name
}

// name computes the request's endpoint and label, once, when a step needs
// them: a request passed through untouched never asks Config.RouteName.
func (rq *httpRequest) name() {
	if rq.label == "" {
		rq.endpoint, rq.label = rq.rt.endpoint(rq)
	}
}

// hookContext is the context a hook of Config gets: the request's, and
// for a hook of the host's own (own), carrying the request
// (RequestFromContext), built once per request and only when asked.
func (rq *httpRequest) hookContext(own bool) context.Context {
	if !own {
		return rq.r.Context()
	}
	if rq.hctx.r == nil {
		rq.hctx = requestContext{Context: rq.r.Context(), r: rq.r}
	}
	return &rq.hctx
}

// requestContext is a request's context carrying the request itself
// (RequestFromContext), kept in the httpRequest rather than allocated.
type requestContext struct {
	context.Context
	r *http.Request
}

// Value returns the request for requestCtxKey, else the parent's value.
func (c *requestContext) Value(key any) any {
	if key == any(requestCtxKey) {
		return c.r
	}
	return c.Context.Value(key)
}

var errBodyTooLarge = errors.New("idempotency: request body too large")

// readBody reads a keyed request's body whole, bounded in size and (where
// the connection allows read deadlines) in time, and restores it for the
// handler. An error means nothing may be claimed: errBodyTooLarge for a body
// over limit, anything else for a body that could not be read whole. The
// buffer grows with the bytes that arrive, never ahead of them: a declared
// Content-Length is a promise, not a reason to allocate.
//
// After an error the read deadline is left expired and the caller answers
// with Connection: close, so nothing more of the body is read: net/http
// would otherwise drain the rest before sending the answer, and then again
// when it closes the body, for as long as the client cares to stall.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	rc := http.NewResponseController(w)
	if r.ContentLength > limit {
		_ = rc.SetReadDeadline(time.Now())
		return nil, errBodyTooLarge
	}
	armed := rc.SetReadDeadline(time.Now().Add(timeout)) == nil
	body, err := readAll(r.Body, limit+1, r.ContentLength)
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr), err == nil && int64(len(body)) > limit:
		err = errBodyTooLarge
	}
	if err != nil {
		if armed {
			_ = rc.SetReadDeadline(time.Now())
		}
		return nil, err
	}
	if armed {
		// Read whole: net/http arms its own deadlines for the next request,
		// and one left in place would fire its background read mid-handler
		// and cancel the connection's context.
		_ = rc.SetReadDeadline(time.Time{})
	}
	rb := &bodyReader{}
	rb.r.Reset(body)
	r.Body = rb
	return body, nil
}

// readAll reads r to its end as io.ReadAll(io.LimitReader(r, n)) does,
// growing its buffer the same way, but starts it no larger than a declared
// length calls for (io.ReadAll starts at 512 bytes): declared, the small
// body of the usual request fits one allocation. A larger declared length
// changes nothing.
func readAll(r io.Reader, n, declared int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 && declared < size {
		size = declared + 1 // room for the read that finds the end
	}
	lr := io.LimitedReader{R: r, N: n}
	b := make([]byte, 0, size)
	for {
		m, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // let append pick the next size
		}
	}
}

// bodyReader is a read body given back to the handler: io.NopCloser of a
// bytes.Reader (the same methods: Read, WriteTo and Close) in one
// allocation.
type bodyReader struct{ r bytes.Reader }

func (b *bodyReader) Read(p []byte) (int, error)         { return b.r.Read(p) }
func (b *bodyReader) WriteTo(w io.Writer) (int64, error) { return b.r.WriteTo(w) }
func (b *bodyReader) Close() error                       { return nil }
