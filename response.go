package idempotency

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

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
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
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
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// writeJSON sends one of the contract's JSON answers.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func notStoredBody(original int) []byte {
	return []byte(`{"error":"idempotency_response_not_stored","original_status":` + itoa(original) + `}`)
}

// Replayable headers: these always, plus each route's allow-list.
// Content-Encoding describes the stored bytes, so it travels with them.
var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location", "Content-Language"}

// neverReplayed are headers that must never be stored: credentials,
// cookies, per-connection and per-message headers.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Www-Authenticate": true, "Date": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, HeaderReplayed: true,
}

// replayAllowList validates a route's extra replay headers and returns the
// full allow-list in canonical form.
func replayAllowList(extra []string) ([]string, error) {
	list := append([]string(nil), defaultReplayHeaders...)
	for _, h := range extra {
		c := http.CanonicalHeaderKey(strings.TrimSpace(h))
		if c == "" || neverReplayed[c] || strings.HasPrefix(c, "Proxy-") {
			return nil, errors.New("idempotency: RouteConfig.ReplayHeaders: header " + strconv.Quote(h) + " may not be replayed")
		}
		if !slices.Contains(list, c) {
			list = append(list, c)
		}
	}
	return list, nil
}

// isJSONType reports whether a Content-Type declares JSON.
func isJSONType(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

var replayedField = []byte(`"idempotency_replayed"`)

// writeReplay sends a stored response: its status, its stored headers,
// Idempotent-Replayed: true, and its body, with "idempotency_replayed": true
// added when the body is a JSON object.
func writeReplay(w http.ResponseWriter, resp Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	body := resp.Body
	if resp.BodyKind == BodyJSON {
		body = markReplayed(body)
	}
	h.Set(HeaderReplayed, "true")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(body)
}

// markReplayed adds "idempotency_replayed": true to a JSON object and
// returns any other JSON value unchanged.
func markReplayed(body []byte) []byte {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) < 2 || trimmed[0] != '{' {
		return body
	}
	if bytes.Contains(trimmed, replayedField) {
		// The field may already exist: set it through a full decode.
		var obj map[string]json.RawMessage
		if json.Unmarshal(trimmed, &obj) != nil {
			return body
		}
		obj["idempotency_replayed"] = json.RawMessage("true")
		out, err := json.Marshal(obj)
		if err != nil {
			return body
		}
		return out
	}
	inner := bytes.TrimSpace(trimmed[1 : len(trimmed)-1])
	out := make([]byte, 0, len(trimmed)+len(replayedField)+7)
	out = append(out, trimmed[:len(trimmed)-1]...)
	out = bytes.TrimRight(out, " \t\r\n")
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = append(out, replayedField...)
	out = append(out, ":true}"...)
	return out
}

// errResponseTooLarge is returned by a transactional route's Write once the
// response outgrew its buffer cap.
var errResponseTooLarge = errors.New("idempotency: the response is over the transactional route's buffer cap")

// errHijack is returned by a wrapped route's Hijack: its response must be
// recorded, which a hijacked connection makes impossible.
var errHijack = errors.New("idempotency: hijacking a connection is not allowed on an idempotency-wrapped route")

// recorder buffers a winner's response so it can be recorded before it is
// sent. A handler that flushes switches an ordinary route's response to
// streaming (what is buffered goes out, the rest streams, the record
// follows); on a transactional route Flush is a no-op until the commit. A
// response that outgrows the record limit is no longer captured; on an
// ordinary route it then streams, so memory stays bounded.
type recorder struct {
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
}

func newRecorder(w http.ResponseWriter, limit int64, holdBack bool) *recorder {
	return &recorder{w: w, limit: limit, holdBack: holdBack}
}

// Header returns the real writer's header map: the handler's headers are
// the response's, and the replayable ones are copied when recording.
func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// As net/http does, but inside the handler, so the key is marked
		// failed rather than recording a status no replay could send.
		panic("idempotency: invalid WriteHeader code " + itoa(code))
	}
	if r.status != 0 {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !r.holdBack {
			r.w.WriteHeader(code) // informational answers go out as they come
		}
		return
	}
	r.status = code
	if r.streaming {
		r.w.WriteHeader(code)
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.streaming {
		r.capture(p)
		return r.w.Write(p)
	}
	if r.tooLarge || r.holdBack && r.holdCap > 0 && int64(r.buf.Len())+int64(len(p)) > r.holdCap {
		// Nothing may be sent before the commit, and memory stays bounded:
		// the response is dropped and the route answers 500.
		r.tooLarge = true
		r.buf = bytes.Buffer{}
		return 0, errResponseTooLarge
	}
	if !r.overflow && int64(r.buf.Len()+len(p)) > r.limit {
		r.overflow = true
		if !r.holdBack {
			// Too large to record: stream it rather than hold it.
			r.startStreaming()
			return r.w.Write(p)
		}
	}
	return r.buf.Write(p)
}

// capture keeps a streamed response's bytes for the record, up to limit.
func (r *recorder) capture(p []byte) {
	if r.overflow {
		return
	}
	if int64(r.buf.Len()+len(p)) > r.limit {
		r.overflow = true
		r.buf = bytes.Buffer{}
		return
	}
	r.buf.Write(p)
}

func (r *recorder) startStreaming() {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.streaming = true
	// The headers go out now: record them as sent, not as the handler may
	// change them later (net/http ignores that). Without a Content-Type,
	// net/http sniffs one from the first bytes written, or sends none when
	// there are none yet: the record says the same, so a replay (whose
	// body goes out whole) is not sniffed differently.
	r.sent = r.w.Header().Clone()
	if _, ok := r.sent["Content-Type"]; !ok && bodyAllowed(r.status) &&
		r.sent.Get("Content-Encoding") == "" && r.sent.Get("Transfer-Encoding") == "" {
		if r.buf.Len() > 0 {
			r.sent["Content-Type"] = []string{http.DetectContentType(r.buf.Bytes())}
		} else {
			r.sent["Content-Type"] = nil // none: and none sniffed on replay
		}
	}
	r.w.WriteHeader(r.status)
	if r.buf.Len() > 0 {
		_, _ = r.w.Write(r.buf.Bytes())
	}
	if r.overflow {
		r.buf = bytes.Buffer{}
	}
}

// Flush implements http.Flusher.
func (r *recorder) Flush() { _ = r.FlushError() }

// FlushError switches the response to streaming and flushes it; on a
// transactional route it does nothing until the commit.
func (r *recorder) FlushError() error {
	if r.holdBack {
		return nil
	}
	if !r.streaming {
		r.startStreaming()
	}
	return http.NewResponseController(r.w).Flush()
}

// Hijack refuses: a hijacked response cannot be recorded.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, errHijack }

// Unwrap exposes the real writer to http.ResponseController only once the
// response streams; while buffering, a flush must not bypass the buffer.
func (r *recorder) Unwrap() http.ResponseWriter {
	if r.streaming {
		return r.w
	}
	return nil
}

// statusCode is the handler's final status; a handler that wrote nothing
// answered 200.
func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// response is what gets recorded: status, replayable headers and body.
func (r *recorder) response(allow []string) Response {
	resp := Response{Status: r.statusCode()}
	h := r.w.Header()
	if r.streaming {
		h = r.sent
	}
	for _, name := range allow {
		if v, ok := h[name]; ok {
			if resp.Header == nil {
				resp.Header = make(http.Header, len(allow))
			}
			resp.Header[name] = append([]string(nil), v...)
		}
	}
	switch {
	case r.overflow:
		resp.BodyKind = BodyNone
	case r.buf.Len() > 0 && isJSONType(h.Get("Content-Type")) && h.Get("Content-Encoding") == "" &&
		utf8.Valid(r.buf.Bytes()) && json.Valid(r.buf.Bytes()):
		// Encoded bytes are not JSON text, whatever Content-Type says of
		// the decoded body.
		resp.BodyKind, resp.Body = BodyJSON, r.buf.Bytes()
	default:
		resp.BodyKind, resp.Body = BodyRaw, r.buf.Bytes()
	}
	return resp
}

// finish sends a buffered response; a streamed one has already gone out.
func (r *recorder) finish() {
	if r.streaming {
		return
	}
	status := r.statusCode()
	h := r.w.Header()
	// No Content-Length with trailers: HTTP/1.1 carries them only in a
	// chunked body.
	if bodyAllowed(status) && h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" && !hasTrailers(h) {
		h.Set("Content-Length", strconv.Itoa(r.buf.Len()))
	}
	r.w.WriteHeader(status)
	if r.buf.Len() > 0 {
		_, _ = r.w.Write(r.buf.Bytes())
	}
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
