package idempotency

import (
	"context"
	"net/http"
	"strconv"
)

// The HTTP adapter's transport: how the engine's decisions reach the
// response writer.

// pass runs the handler with no claim.
func (rq *httpRequest) pass(keyed bool) {
	r := rq.r
	if keyed {
		r = r.WithContext(rq.withKey(r.Context(), rq.bypassRecord()))
	}
	rq.rt.next.ServeHTTP(rq.w, r)
}

// handle runs the handler into a buffer: for the record on an owned run;
// whole, until the commit, on a transactional route, whose headers set
// before it ran are kept for an answer that replaces the handler's.
func (rq *httpRequest) handle(ctx context.Context, limit int64, held bool) {
	rq.buf = newResponseBuffer(rq.w, limit, held)
	if held {
		rq.before = rq.w.Header().Clone()
		rq.buf.holdCap = bufferCap(rq.rt.maxResponse)
	}
	rq.rt.next.ServeHTTP(rq.buf, rq.r.WithContext(ctx))
}

func (rq *httpRequest) status() int      { return rq.buf.statusCode() }
func (rq *httpRequest) tooLarge() bool   { return rq.buf.tooLarge }
func (rq *httpRequest) result() Response { return rq.buf.response(rq.rt.replayHeaders) }
func (rq *httpRequest) send()            { rq.buf.finish() }

// auditContext is the request's context, carrying the request.
func (rq *httpRequest) auditContext() context.Context { return rq.hookContext(true) }

// reconciled is a Reconcile hook's done value as the route records it.
func (rq *httpRequest) reconciled(v any) (Response, error) {
	return reconciledHTTP(v, rq.rt.replayHeaders)
}

// replay sends a stored response.
func (rq *httpRequest) replay(resp Response) { writeReplay(rq.w, resp, rq.rt.marker) }

// deliver sends answer a: its status, headers and body, or what
// Config.ErrorWriter writes. After a held run the handler's headers are
// dropped first.
func (rq *httpRequest) deliver(a answer, original int) {
	ans := &answers[a]
	h := rq.w.Header()
	if rq.before != nil {
		restoreHeader(h, rq.before)
	}
	if ans.close {
		// The rest of the body stays unread: the connection cannot carry
		// another request.
		h.Set("Connection", "close")
	}
	if ans.retryAfter != "" {
		h.Set("Retry-After", ans.retryAfter)
	}
	if rq.m.cfg.ErrorWriter != nil {
		rq.m.cfg.ErrorWriter(rq.w, rq.r, rq.m.errorAnswer(a, original))
		return
	}
	body := rq.m.bodies[a]
	if original != 0 {
		body = rq.m.render(rq.m.errorAnswer(a, original))
	}
	contentType := "application/json"
	if rq.m.cfg.ErrorFormat == ErrorProblem {
		contentType = "application/problem+json"
	}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	rq.w.WriteHeader(ans.status)
	_, _ = rq.w.Write(body)
}

// restoreHeader drops every header the handler set, keeping those set
// before it ran (CORS, request ids, HSTS from outer middleware), before the
// middleware answers instead of the handler.
func restoreHeader(h, before http.Header) {
	clear(h)
	for k, v := range before {
		h[k] = v
	}
}
