package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"time"
)

// execution is one run of the wrapped handler: for the winner of a claim (owned),
// or unclaimed on a transactional route, which gives every request its
// transaction. It is the only code that runs the handler into a buffer.
type execution struct {
	request  // a copy: the run may change its request (the key in its context)
	owned    bool
	fence    Fence     // owned: the claim's fence
	own      Record    // owned: the claimed row, which the record is bound to
	leaseEnd time.Time // owned: the end of the claim's lease
	tx       RouteTx   // transactional routes: the handler's transaction
	closeTx  func()    // transactional routes: closes the handler's view of tx
	before   http.Header
	buf      *responseBuffer
}

// execute runs the handler of a won claim, settles its outcome, then sends
// the response. tx is the transaction that holds a transactional route's
// claim.
func (rq *request) execute(own Record, claimedAt time.Time, tx RouteTx) {
	rq.run(&own, claimedAt, tx)
}

// run runs the handler, for the claim own (nil: unclaimed) made at
// claimedAt (in tx on a transactional route): transaction, deadline,
// buffer, panic, classify, settle.
func (rq *request) run(own *Record, claimedAt time.Time, tx RouteTx) {
	x := &execution{request: *rq, tx: tx}
	if own != nil {
		x.owned, x.fence, x.own, x.leaseEnd = true, own.Fence(), *own, claimedAt.Add(rq.m.cfg.Lease)
		x.r = x.withKey()
	}
	switch {
	case rq.rt.txStore == nil:
	case tx == nil:
		if !x.begin() {
			return
		}
	default:
		x.before = x.w.Header().Clone()
	}
	if x.owned && x.tooLate() {
		x.giveBack(claimedAt)
		return
	}
	ctx, cancel := x.handlerContext()
	defer cancel()
	x.buf = x.newBuffer()
	finished := false
	defer func() {
		if !finished {
			x.handlerDone()
			x.panicked(recover())
		}
	}()
	rq.rt.next.ServeHTTP(x.buf, x.r.WithContext(ctx))
	finished = true
	x.handlerDone()
	cancel()
	x.conclude()
}

// handlerContext is the handler's context. A claim's handler is detached
// from the client's connection (a client that hangs up does not cancel an
// order half-way) and must finish in time for its outcome to be settled
// inside the lease.
func (x *execution) handlerContext() (context.Context, context.CancelFunc) {
	ctx, cancel := x.r.Context(), context.CancelFunc(func() {})
	if x.owned {
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), x.leaseEnd.Add(-x.m.cfg.StoreTimeout))
	}
	if x.tx != nil {
		ctx, x.closeTx = withTx(ctx, x.tx.Tx())
	}
	return ctx, cancel
}

// handlerDone closes the handler's view of its transaction once the
// handler returned (or panicked): from then on only the middleware uses
// the connection, and a handler that kept the transaction is refused.
func (x *execution) handlerDone() {
	if x.closeTx != nil {
		x.closeTx()
	}
}

// newBuffer buffers the handler's response: for the record on an owned
// run; whole, until the commit, on a transactional route.
func (x *execution) newBuffer() *responseBuffer {
	limit := int64(0)
	if x.owned {
		limit = x.rt.maxResponse
	}
	b := newResponseBuffer(x.w, limit, x.tx != nil)
	if x.tx != nil {
		b.holdCap = bufferCap(x.rt.maxResponse)
	}
	return b
}

// tooLate reports whether the handler's deadline (the lease's end less the
// store timeout) passed before it could start, because the claim (or a
// transactional route's BEGIN) was slow. Such a handler is not run with a
// dead context, which would settle its failure against the key: the key is
// given back instead (giveBack).
func (x *execution) tooLate() bool {
	return !time.Now().Before(x.leaseEnd.Add(-x.m.cfg.StoreTimeout))
}

// giveBack releases a won key whose handler never ran and asks the client
// to retry.
func (x *execution) giveBack(claimedAt time.Time) {
	if x.tx != nil {
		x.abort() // the claim rolls back with the transaction
	} else {
		// Nothing ran, so the release may be retried (fenced) for as long
		// as it takes, in the background once the client had its 503.
		x.releaseUnrun(claimedAt)
	}
	x.m.log.WarnContext(x.r.Context(), "idempotency: the store was too slow to leave the handler any time; key given back",
		"endpoint", x.claim.Endpoint, "key", x.claim.Key)
	x.answer(answerUnavailable)
}

// panicked settles a handler that panicked (or called runtime.Goexit, where
// p is nil), then re-raises.
func (x *execution) panicked(p any) {
	switch {
	case x.tx != nil:
		o := x.failed()
		if x.checkState() == TxEnded {
			o = outcomeFail // what it committed itself stays: never free the key
		}
		x.settleTx(o, Response{})
		if x.owned {
			x.observe(OutcomeExecuted, settledReason(o), 0)
		}
	case x.owned:
		x.settle(x.own, x.failed(), Response{}, x.leaseEnd)
		x.observe(OutcomeExecuted, settledReason(x.failed()), 0)
	}
	if p != nil { // nil: runtime.Goexit, which carries on by itself
		panic(p)
	}
}

// conclude settles the outcome of a handler that returned, and sends its
// response or the answer that replaces it.
func (x *execution) conclude() {
	if x.tx != nil {
		x.concludeTx()
		return
	}
	o := x.classify(x.buf.statusCode(), TxOpen)
	if x.owned {
		resp := Response{}
		if o == outcomeComplete {
			resp = x.buf.response(x.rt.replayHeaders)
		}
		x.settle(x.own, o, resp, x.leaseEnd)
	}
	x.buf.finish()
	if x.owned {
		x.observe(OutcomeExecuted, settledReason(o), x.buf.statusCode())
	}
}

// classify maps the handler's status, and how it left its transaction, to
// the outcome to settle. A transaction the handler ended itself may have
// committed its writes already, so its key is never given back; a 429, or
// any answer below 500 on a NoStore route, gives the key back.
func (x *execution) classify(status int, state TxState) outcome {
	switch {
	case state == TxEnded && status >= 500:
		return outcomeFail
	case state == TxEnded:
		return outcomeComplete
	case status == http.StatusTooManyRequests, x.rt.noStore && status < 500:
		return outcomeRelease
	case status >= 500:
		return x.failed()
	}
	return outcomeComplete
}

// failed is the outcome of a handler that failed (>= 500 or panic):
// released on a transactional route with ReleaseOnError, whose rollback
// proves nothing happened, else failed.
func (x *execution) failed() outcome {
	if x.rt.releaseOnError {
		return outcomeRelease
	}
	return outcomeFail
}

// txBufferFactor is how many times its MaxResponseBytes a transactional
// route buffers at most: nothing may be sent before the commit, so the
// whole response waits in memory.
const txBufferFactor = 4

// bufferCap is a transactional route's buffer cap for a response limit.
func bufferCap(maxResponse int64) int64 {
	if maxResponse > math.MaxInt64/txBufferFactor {
		return math.MaxInt64
	}
	return txBufferFactor * maxResponse
}

// outcome is what settling writes to a claimed key.
type outcome int

const (
	outcomeComplete outcome = iota // Store.Complete, with the response
	outcomeFail                    // Store.Fail
	outcomeRelease                 // Store.Release
)

// settle writes a handler's outcome to its key, retrying until deadline. An
// outcome that cannot be settled leaves the key in flight: it is never
// executed again, and later answers idempotency_outcome_unknown.
func (rq *request) settle(own Record, o outcome, resp Response, deadline time.Time) {
	f := own.Fence()
	op, call := "complete", func(c context.Context) error { return rq.m.store.Complete(c, f, own, resp) }
	switch o {
	case outcomeFail:
		op, call = "fail", func(c context.Context) error { return rq.m.store.Fail(c, f) }
	case outcomeRelease:
		op, call = "release", func(c context.Context) error { return rq.m.store.Release(c, f) }
	}
	backoff := 25 * time.Millisecond
	for try := 1; ; try++ {
		_, err := storeCall(rq, op, func(c context.Context) (struct{}, error) { return struct{}{}, call(c) })
		switch {
		case err == nil:
			return
		case errors.Is(err, ErrNotOwner) && try > 1:
			// The earlier attempt may have landed with its reply lost.
			rq.logSettle(slog.LevelWarn, "idempotency: outcome already settled or key taken over; an earlier attempt's reply was lost", op)
			return
		case errors.Is(err, ErrNotOwner):
			rq.logSettle(slog.LevelError, "idempotency: key was taken over while its handler ran; outcome not settled", op)
			rq.rm.settleFailures.Inc()
			rq.recordFailed = true
			return
		case storeReason(err) == ReasonData, time.Now().Add(backoff + rq.m.cfg.StoreTimeout).After(deadline):
			// A refused value fails every retry alike: do not keep the
			// client waiting for the lease.
			rq.logSettle(slog.LevelError, "idempotency: could not settle the outcome; the key stays in flight", op,
				"reason", storeReason(err), "error", err)
			rq.rm.settleFailures.Inc()
			rq.recordFailed = true
			return
		}
		time.Sleep(backoff) // back off before retrying a failing store
		backoff = min(2*backoff, time.Second)
	}
}

// logSettle logs an event of settling op for the request's key.
func (rq *request) logSettle(level slog.Level, msg, op string, args ...any) {
	args = append([]any{"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "operation", op}, args...)
	rq.m.log.Log(rq.r.Context(), level, msg, args...)
}
