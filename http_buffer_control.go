package idempotency

import (
	"net/http"
	"time"
)

// The connection controls of http.ResponseController that change no bytes
// of the response are passed to the real writer, buffering or not. Flush
// and Hijack are the buffer's own (http_buffer.go), and Unwrap exposes the
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
