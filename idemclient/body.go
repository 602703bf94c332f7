package idemclient

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// body gives each attempt the request's body: the same bytes every time
// when replayable, else the caller's body once.
type body struct {
	first      io.ReadCloser                 // the first attempt's body
	getBody    func() (io.ReadCloser, error) // later attempts' bodies; nil when not replayable
	length     int64                         // ContentLength of every attempt
	replayable bool
}

// newBody makes req's body replayable where it can: no body, a GetBody, or
// a body of at most limit bytes, read into memory (limit < 0: never). On an
// error it has closed req.Body, as RoundTrip must.
func newBody(req *http.Request, limit int64) (*body, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return &body{first: req.Body, getBody: req.GetBody, length: req.ContentLength, replayable: true}, nil
	case req.GetBody != nil:
		return &body{first: req.Body, getBody: req.GetBody, length: req.ContentLength, replayable: true}, nil
	case limit < 0 || req.ContentLength > limit:
		return &body{first: req.Body, length: req.ContentLength}, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		req.Body.Close()
		return nil, fmt.Errorf("idemclient: read the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to buffer: sent once, as it is.
		rest := &readCloser{Reader: io.MultiReader(bytes.NewReader(buf), req.Body), Closer: req.Body}
		return &body{first: rest, length: req.ContentLength}, nil
	}
	req.Body.Close()
	if req.ContentLength > 0 && req.ContentLength != int64(len(buf)) {
		return nil, fmt.Errorf("idemclient: ContentLength=%d with a body of %d bytes", req.ContentLength, len(buf))
	}
	if len(buf) == 0 {
		// An empty body of unknown length: send none rather than probe.
		get := func() (io.ReadCloser, error) { return http.NoBody, nil }
		return &body{first: http.NoBody, getBody: get, replayable: true}, nil
	}
	get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ := get()
	return &body{first: first, getBody: get, length: int64(len(buf)), replayable: true}, nil
}

// forAttempt sets r's body for attempt n (from 1).
func (b *body) forAttempt(r *http.Request, n int) error {
	r.GetBody, r.ContentLength = b.getBody, b.length
	if n == 1 || b.first == nil || b.first == http.NoBody {
		r.Body = b.first
		return nil
	}
	rc, err := b.getBody()
	if err != nil {
		return fmt.Errorf("idemclient: GetBody: %w", err)
	}
	r.Body = rc
	return nil
}

// readCloser joins a reader and a closer.
type readCloser struct {
	io.Reader
	io.Closer
}
