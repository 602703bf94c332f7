package idempotency

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// request is one request on its way through a route: what the route knows
// of it so far, computed once and handed from step to step.
type request struct {
	rt *route
	m  *Middleware
	w  http.ResponseWriter
	r  *http.Request
	// Set by name, once a step needs them:
	endpoint string // the key's scope_endpoint
	label    string // the metrics label: a route name or pattern, never a raw path
	// Set by admit, for a keyed request:
	claim ClaimRequest  // key, scope, endpoint, request hash, TTL, lease, owner token
	rm    *routeMetrics // the label's counters
	// Set by claimKey:
	claimStart time.Time // when the first claiming call began: the earliest the lease can have started
	// For Config.Observer:
	start        time.Time     // when the request reached the route (only with an Observer)
	storeTime    time.Duration // time spent in store calls
	recordFailed bool          // an outcome could not be settled
	hit, miss    bool          // counted in idempotency_hit_total or idempotency_miss_total
	storeReason  string        // the reason of the store error the claim failed with
	observed     bool          // the decision was reported
}

func (rt *route) newRequest(w http.ResponseWriter, r *http.Request) request {
	return request{rt: rt, m: rt.m, w: w, r: r, start: rt.startClock()}
}

// endpoint returns the key's scope_endpoint and the metrics label.
func (rt *route) endpoint(r *http.Request) (endpoint, label string) {
	name := rt.name
	if name == "" && rt.m.cfg.RouteName != nil {
		name = rt.m.cfg.RouteName(r)
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
func (rq *request) name() {
	if rq.label == "" {
		rq.endpoint, rq.label = rq.rt.endpoint(rq.r)
	}
}

// withKey returns the request with its key in the context, for a handler
// that runs under it.
func (rq *request) withKey() *http.Request { return withKey(rq.r, rq.claim.Key) }

// maxScopeBytes bounds a key's user scope and its endpoint, so that (key,
// scope, endpoint) always fits the store's unique index (a btree entry
// holds about 2.7 kB).
const maxScopeBytes = 1024

// storable reports whether s can be stored as a scope or endpoint: valid
// UTF-8 without NUL bytes (Postgres TEXT refuses both), at most
// maxScopeBytes.
func storable(s string) bool {
	return len(s) <= maxScopeBytes && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
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
