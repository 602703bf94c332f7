package idempotency

import (
	"time"
)

// serve takes an admitted call its way: claim its key, then execute the
// handler if the claim was won, or answer as the key's record calls for.
func (rq *request) serve() {
	res, err := rq.claimKey()
	switch {
	case err != nil:
		rq.claimFailed(err)
	case res.outcome == claimWon:
		rq.execute(res.record, res.claimedAt, res.tx)
	case res.outcome == claimContended:
		rq.answer(answerInFlight)
	default:
		rq.answerDuplicate(res.record)
	}
}

// claimFailed applies the route's policy to a claim the store could not
// answer: contention is in flight, a refused value is 400, an outage is 503
// on a fail-closed route and a bypass on a fail-open one.
func (rq *request) claimFailed(err error) {
	reason := storeReason(err)
	switch {
	case reason == ReasonConflict:
		// Contention, not an outage: other requests keep changing this
		// key's row (serialization failures past the retries, a takeover
		// lost every round). One of them owns the key, so a fail-open
		// bypass would run the handler beside it: the key is in flight.
		rq.answer(answerInFlight)
	case reason == ReasonData:
		// A store that refuses this request's values is not down: it
		// would refuse every retry alike, so a fail-open bypass would run
		// each one, and a 503 would invite retries that cannot succeed.
		rq.m.log.WarnContext(rq.ctx, "idempotency: the store refused the request's scope or endpoint",
			"endpoint", rq.label, "operation", "claim", "error", err)
		rq.answer(answerInvalidScope)
	case rq.rt.failOpen && reason != ReasonFull:
		// A full memory store is not down either: any client can fill it
		// on purpose, and must not earn a bypass by doing so.
		rq.m.log.WarnContext(rq.ctx, "idempotency: store unavailable, running without deduplication",
			"endpoint", rq.label, "operation", "claim", "reason", reason, "error", err)
		rq.m.metrics.bypasses.WithLabelValues(rq.label, reasonStoreUnavailable).Inc()
		rq.observeUnrun(OutcomeBypassed, reasonStoreUnavailable)
		rq.t.pass(rq.claim.Key)
	default:
		rq.m.log.WarnContext(rq.ctx, "idempotency: store unavailable, rejecting",
			"endpoint", rq.label, "operation", "claim", "reason", reason, "error", err)
		rq.cause = err
		rq.answer(answerUnavailable)
		rq.forgetClaim(err) // the handler never ran: free the key if the claim landed
	}
}

// switchedOff passes a call through with the kill-switch off, counted as a
// bypass. The adapter has named the call.
func (rq *request) switchedOff() {
	rq.m.metrics.bypasses.WithLabelValues(rq.label, reasonDisabled).Inc()
	rq.observeUnrun(OutcomeBypassed, reasonDisabled)
	rq.passThrough()
}

// passThrough runs the handler with no idempotency tracking. A
// transactional route still gets its transaction, so the handler has one
// shape; the adapter has named such a call.
func (rq *request) passThrough() {
	if rq.rt.txStore == nil {
		rq.t.pass("")
		return
	}
	rq.run(nil, time.Time{}, nil)
}
