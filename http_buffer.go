package idempotency

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// errResponseTooLarge is returned by a transactional route's Write once the
// response outgrew its buffer cap.
var errResponseTooLarge = errors.New("idempotency: the response is over the transactional route's buffer cap")

// errHijack is returned by a wrapped route's Hijack: its response must be
// recorded, which a hijacked connection makes impossible.
var errHijack = errors.New("idempotency: hijacking a connection is not allowed on an idempotency-wrapped route")

// responseBuffer buffers a winner's response so it can be recorded before it is
// sent. A handler that flushes switches an ordinary route's response to
// streaming (what is buffered goes out, the rest streams, the record
// follows); on a transactional route Flush is a no-op until the commit. A
// response that outgrows the record limit is no longer captured; on an
// ordinary route it then streams, so memory stays bounded.
type responseBuffer struct {
	w         http.ResponseWriter
	status    int
	buf       bytes.Buffer
	limit     int64
	overflow  bool // the body outgrew limit: recorded without body
	streaming bool
	holdBack  bool        // transactional: nothing is sent before the commit
	holdCap   int64       // holdBack: the most it buffers (0: no cap)
	tooLarge  bool        // holdBack: the body outgrew holdCap and was dropped
	sent      http.Header // streaming: the headers as they went out
	expires   time.Time   // the claimed row's expiry, sent as Idempotency-Expires (zero: none)
}

func newResponseBuffer(w http.ResponseWriter, limit int64, holdBack bool) *responseBuffer {
	return &responseBuffer{w: w, limit: limit, holdBack: holdBack}
}

// Header returns the real writer's header map: the handler's headers are
// the response's, and the replayable ones are copied when recording.
func (b *responseBuffer) Header() http.Header { return b.w.Header() }

func (b *responseBuffer) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// As net/http does, but inside the handler, so the key is marked
		// failed rather than recording a status no replay could send.
		panic("idempotency: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if b.status != 0 {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !b.holdBack {
			b.w.WriteHeader(code) // informational answers go out as they come
		}
		return
	}
	b.status = code
	if b.streaming {
		b.w.WriteHeader(code)
	}
}

func (b *responseBuffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	if b.streaming {
		b.capture(p)
		return b.w.Write(p)
	}
	if b.tooLarge || b.holdBack && b.holdCap > 0 && int64(b.buf.Len())+int64(len(p)) > b.holdCap {
		// Nothing may be sent before the commit, and memory stays bounded:
		// the response is dropped and the route answers 500.
		b.tooLarge = true
		b.buf = bytes.Buffer{}
		return 0, errResponseTooLarge
	}
	if !b.overflow && int64(b.buf.Len()+len(p)) > b.limit {
		b.overflow = true
		if !b.holdBack {
			// Too large to record: stream it rather than hold it.
			b.startStreaming()
			return b.w.Write(p)
		}
	}
	return b.buf.Write(p)
}

// capture keeps a streamed response's bytes for the record, up to limit.
func (b *responseBuffer) capture(p []byte) {
	if b.overflow {
		return
	}
	if int64(b.buf.Len()+len(p)) > b.limit {
		b.overflow = true
		b.buf = bytes.Buffer{}
		return
	}
	b.buf.Write(p)
}

func (b *responseBuffer) startStreaming() {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	b.streaming = true
	// The headers go out now: record them as sent, not as the handler may
	// change them later (net/http ignores that). Without a Content-Type,
	// net/http sniffs one from the first bytes written, or sends none when
	// there are none yet: the record says the same, so a replay (whose
	// body goes out whole) is not sniffed differently.
	b.sent = b.w.Header().Clone()
	expiresHeader(b.w.Header(), b.expires) // after the copy: never recorded
	if _, ok := b.sent["Content-Type"]; !ok && bodyAllowed(b.status) &&
		b.sent.Get("Content-Encoding") == "" && b.sent.Get("Transfer-Encoding") == "" {
		if b.buf.Len() > 0 {
			b.sent["Content-Type"] = []string{http.DetectContentType(b.buf.Bytes())}
		} else {
			b.sent["Content-Type"] = nil // none: and none sniffed on replay
		}
	}
	b.w.WriteHeader(b.status)
	if b.buf.Len() > 0 {
		_, _ = b.w.Write(b.buf.Bytes())
	}
	if b.overflow {
		b.buf = bytes.Buffer{}
	}
}

// Flush implements http.Flusher.
func (b *responseBuffer) Flush() { _ = b.FlushError() }

// FlushError switches the response to streaming and flushes it; on a
// transactional route it does nothing until the commit.
func (b *responseBuffer) FlushError() error {
	if b.holdBack {
		return nil
	}
	if !b.streaming {
		b.startStreaming()
	}
	return http.NewResponseController(b.w).Flush()
}

// Hijack refuses: a hijacked response cannot be recorded.
func (b *responseBuffer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, errHijack }

// Unwrap exposes the real writer to http.ResponseController only once the
// response streams; while buffering, a flush must not bypass the buffer.
func (b *responseBuffer) Unwrap() http.ResponseWriter {
	if b.streaming {
		return b.w
	}
	return nil
}

// statusCode is the handler's final status; a handler that wrote nothing
// answered 200.
func (b *responseBuffer) statusCode() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

// response is what gets recorded: status, replayable headers and body.
func (b *responseBuffer) response(allow []string) Response {
	resp := Response{Status: b.statusCode()}
	h := b.w.Header()
	if b.streaming {
		h = b.sent
	}
	trailers := declaredTrailers(h)
	for _, name := range allow {
		if v, ok := h[name]; ok && !trailers[name] {
			if resp.Header == nil {
				resp.Header = make(http.Header, len(allow))
			}
			resp.Header[name] = append([]string(nil), v...)
		}
	}
	switch {
	case b.overflow:
		resp.BodyKind = BodyNone
	case b.buf.Len() > 0 && isJSONType(h.Get("Content-Type")) && h.Get("Content-Encoding") == "" &&
		utf8.Valid(b.buf.Bytes()) && json.Valid(b.buf.Bytes()):
		// Encoded bytes are not JSON text, whatever Content-Type says of
		// the decoded body.
		resp.BodyKind, resp.Body = BodyJSON, b.buf.Bytes()
	default:
		resp.BodyKind, resp.Body = BodyRaw, b.buf.Bytes()
	}
	return resp
}

// finish sends a buffered response; a streamed one has already gone out.
func (b *responseBuffer) finish() {
	if b.streaming {
		return
	}
	status := b.statusCode()
	h := b.w.Header()
	// No Content-Length with trailers: HTTP/1.1 carries them only in a
	// chunked body.
	if bodyAllowed(status) && h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" && !hasTrailers(h) {
		h["Content-Length"] = []string{strconv.Itoa(b.buf.Len())} // canonical: Header.Set without its canonicalisation
	}
	expiresHeader(h, b.expires)
	b.w.WriteHeader(status)
	if b.buf.Len() > 0 {
		_, _ = b.w.Write(b.buf.Bytes())
	}
}

// declaredTrailers returns the names the response declared as trailers
// (the Trailer header), canonical: their values are sent after the body
// and are never recorded, even when the route replays a header of the same
// name. It is nil, without allocating, for the usual response without one.
func declaredTrailers(h http.Header) map[string]bool {
	values := h["Trailer"]
	if len(values) == 0 {
		return nil
	}
	names := make(map[string]bool)
	for _, v := range values {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				names[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return names
}

// hasTrailers reports whether the handler declared trailers.
func hasTrailers(h http.Header) bool {
	if _, ok := h["Trailer"]; ok {
		return true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// isJSONType reports whether a Content-Type declares JSON.
func isJSONType(ct string) bool {
	switch ct {
	case "":
		return false
	case "application/json": // the usual one, without parsing
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// The connection controls of http.ResponseController that change no bytes
// of the response are passed to the real writer, buffering or not. Flush
// and Hijack are the buffer's own (above), and Unwrap exposes the
// real writer only once the response streams, so a controller can never
// reach past the buffer for those.

// SetReadDeadline sets the connection's read deadline
// (http.ResponseController.SetReadDeadline).
func (b *responseBuffer) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(b.w).SetReadDeadline(t)
}

// SetWriteDeadline sets the connection's write deadline
// (http.ResponseController.SetWriteDeadline); a buffered response is
// written under it when the handler has returned.
func (b *responseBuffer) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(b.w).SetWriteDeadline(t)
}

// EnableFullDuplex lets the handler read the request body after writing
// (http.ResponseController.EnableFullDuplex).
func (b *responseBuffer) EnableFullDuplex() error {
	return http.NewResponseController(b.w).EnableFullDuplex()
}
