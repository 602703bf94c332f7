package idemclient

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// readWhole reads resp's body into memory when it ends within limit bytes,
// so that a body cut before its end fails the attempt (and is retried like
// a lost answer) instead of the caller's read. A body declared or found
// longer than limit, an event stream (read as it comes, and it may never
// end), a connection (a protocol switch, CONNECT: its body is writable)
// and a negative limit are left to stream. On an error it has closed
// resp's body.
func readWhole(resp *http.Response, limit int64) (*http.Response, error) {
	_, conn := resp.Body.(io.Writer)
	if limit < 0 || resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength > limit || conn ||
		isEventStream(resp.Header.Get("Content-Type")) {
		return resp, nil
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("idemclient: the answer (%d) was cut after %d bytes of its body: %w", resp.StatusCode, len(buf), err)
	}
	if int64(len(buf)) > limit {
		// Longer than it may be held: the rest streams.
		resp.Body = &readCloser{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
		return resp, nil
	}
	resp.Body.Close()
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(buf)), int64(len(buf))
	return resp, nil
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}
