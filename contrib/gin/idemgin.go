// Package idemgin adapts github.com/idemkit/idempotency to gin
// (github.com/gin-gonic/gin).
//
// The usual adapter, which swaps only Header, Write and WriteHeader of
// gin's writer, is not enough: c.AbortWithStatus and c.Writer.WriteHeaderNow
// go through gin's own writer and put a status on the wire before the
// middleware has recorded the response, so the client sees one answer and
// every replay another. A status without a body (c.Status, c.Redirect on a
// POST) is sent by gin's engine after the chain returns, past the
// middleware, which would record 200. gin's engine also keeps running the
// route's handlers after a middleware that answered without calling c.Next
// (a replay, a 409) unless it aborts. And with engine-wide middleware,
// gin's own 404 and 405 run through it and are written after it returns.
// Middleware hands the handlers a complete gin.ResponseWriter over the
// idempotency middleware's writer, sends a status-only answer before the
// middleware records it, aborts the chain when the handlers did not run,
// restores gin's writer and request afterwards (also on a panic, for a
// recovery middleware outside), and passes unmatched routes through.
package idemgin

import (
	"bufio"
	"context"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idempotency"
)

type routeKey struct{}

// Middleware adapts one route's idempotency middleware (from
// Middleware.Route or MustRoute) to gin: use it with engine.Use,
// group.Use or in a route's handler list, before the handlers it guards.
// Requests gin matched to no route (its own 404 and 405) pass through
// unclaimed.
func Middleware(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		route := c.FullPath()
		if route == "" {
			c.Next()
			return
		}
		origW, origR := c.Writer, c.Request
		ran := false
		defer func() { c.Writer, c.Request = origW, origR }()
		r := origR.WithContext(context.WithValue(origR.Context(), routeKey{}, route))
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			c.Request = r
			gw := &writer{ResponseWriter: w, status: http.StatusOK, size: noWritten}
			c.Writer = gw
			c.Next()
			// A status without a body (c.Status(204), c.Redirect on a
			// POST) is only noted by gin's writer; gin's engine sends it
			// once the chain returned, which is past the middleware, so
			// 200 would be recorded and replayed. Send it now, as the
			// engine would (not after a panic: that fails the key).
			gw.WriteHeaderNow()
		})).ServeHTTP(origW, r)
		if !ran {
			// The middleware answered (a replay, a 409, a 400): the
			// handlers after it must not run.
			c.Abort()
		}
	}
}

// RouteName is a Config.RouteName for gin: the request's method and its
// route's full path, such as "POST /accounts/:id/orders". It answers only
// inside Middleware (gin's route is on its Context, not the request), and
// "" elsewhere, so the middleware falls back to r.Pattern, then to
// "unnamed".
func RouteName(ctx context.Context) string {
	r, ok := idempotency.RequestFromContext(ctx)
	if !ok {
		return ""
	}
	p, _ := r.Context().Value(routeKey{}).(string)
	if p == "" {
		return ""
	}
	return r.Method + " " + p
}

const noWritten = -1

// writer is a gin.ResponseWriter over the idempotency middleware's writer,
// with gin's semantics: WriteHeader only sets the status, which goes out
// with the first Write, WriteHeaderNow or Flush.
type writer struct {
	http.ResponseWriter
	status int
	size   int
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != noWritten }

// Flush sends the status, then flushes (which turns a recorded response
// into a streamed one).
func (w *writer) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack asks the underlying writer, which refuses on a keyed request: its
// response must be recorded.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify is part of gin.ResponseWriter; use the request's context
// instead. The channel never fires unless the underlying writer has one.
func (w *writer) CloseNotify() <-chan bool {
	//lint:ignore SA1019 gin.ResponseWriter requires it
	if cn, ok := w.ResponseWriter.(http.CloseNotifier); ok {
		return cn.CloseNotify()
	}
	return make(chan bool)
}

// Pusher returns the underlying writer's http.Pusher, or nil.
func (w *writer) Pusher() http.Pusher {
	p, _ := w.ResponseWriter.(http.Pusher)
	return p
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
