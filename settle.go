package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// ordinary is the settlement of a route without a transaction: the
// handler's outcome is written to its key by a fenced store call after the
// handler returned, before the result is delivered.
type ordinary struct{}

// giveBack releases the key. Nothing ran, so the release may be retried
// (fenced) for as long as it takes, in the background once the caller had
// its 503.
func (ordinary) giveBack(x *execution) { x.giveBackWon(x.claimed) }

// panicked settles a handler that panicked as failed.
func (ordinary) panicked(x *execution) {
	if x.owned && !x.lostLease() {
		x.settle(x.own, x.failed(), Response{}, x.leaseEnd)
		x.observe(OutcomeExecuted, settledReason(x.failed()), 0)
	}
}

// conclude settles the outcome of a handler that returned, then delivers
// its result.
func (ordinary) conclude(x *execution) {
	if x.lostLease() {
		x.answer(answerLeaseLost)
		return
	}
	if x.unsettled() {
		x.unsettle()
		return
	}
	o := x.classify(x.t.status())
	if x.owned {
		resp := Response{}
		if o == outcomeComplete {
			resp = x.t.result()
		}
		x.settle(x.own, o, resp, x.leaseEnd)
	}
	x.t.send()
	if x.owned {
		x.observe(OutcomeExecuted, settledReason(o), x.t.status())
	}
}

// lostLease reports whether a Heartbeat run lost its key's lease (the
// heartbeat logged why). Nothing is recorded then: the key is another
// owner's, or its lease may be over before a record could land, where a
// retry answers idempotency_outcome_unknown as after a crash.
func (x *execution) lostLease() bool {
	if x.leaseLost {
		x.rm.settleFailures.Inc()
		x.recordFailed = true
	}
	return x.leaseLost
}

// settle writes a handler's outcome to its key, retrying until deadline. An
// outcome that cannot be settled leaves the key in flight: it is never
// executed again, and later answers idempotency_outcome_unknown.
func (rq *request) settle(own Record, o outcome, resp Response, deadline time.Time) {
	rq.releasing(o)
	f := own.Fence()
	f.wake = rq.policy.waitInFlight > 0
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

// releasing notes that outcome o gives the key back: the row goes, so no
// answer advertises its expiry.
func (rq *request) releasing(o outcome) {
	if o == outcomeRelease {
		rq.expires = time.Time{}
	}
}

// logSettle logs an event of settling op for the request's key.
func (rq *request) logSettle(level slog.Level, msg, op string, args ...any) {
	args = append([]any{"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "operation", op}, args...)
	rq.m.log.Log(rq.ctx, level, msg, args...)
}
