package idempotency

import (
	"time"
)

// Outcome is how the middleware decided one request (Observation.Outcome).
type Outcome string

// The outcomes of a request, each with the Reason values it carries.
const (
	// OutcomePassThrough: no key on an optional route; nothing claimed.
	OutcomePassThrough Outcome = "pass_through"
	// OutcomeBypassed: the handler ran without deduplication. Reason: "disabled"
	// (kill-switch) or "store_unavailable" (fail-open route).
	OutcomeBypassed Outcome = "bypassed"
	// OutcomeExecuted: the request claimed its key and its handler ran. Reason:
	// "completed", "failed", "released" (what was settled), or
	// "response_too_large" (a transactional response over its buffer, answered
	// 500).
	OutcomeExecuted Outcome = "executed"
	// OutcomeReplayed: the key's stored response was sent.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeConflict: a 409 or 422 for a key that is not this request's to run.
	// Reason as idempotency_conflicts_total: in_flight, previous_failed,
	// outcome_unknown, body_mismatch, not_stored.
	OutcomeConflict Outcome = "conflict"
	// OutcomeRejected: a 4xx or 503 without a usable result. Reason as
	// idempotency_rejections_total: missing_key, invalid_key, invalid_scope,
	// body_too_large, body_unreadable, store_unavailable, lease_lost.
	OutcomeRejected Outcome = "rejected"
)

// Observation describes one decided request, for Config.Observer.
type Observation struct {
	Outcome  Outcome // how the request was decided
	Reason   string  // the outcome's reason; "" for pass_through and replayed
	Endpoint string  // the metrics label: a route's name or pattern, "unnamed", or do:<name>
	// Scope is the user scope (its HMAC under Config.IdentifierSecret; "" under
	// Config.OmitIdentifiers and before the scope is known).
	Scope string
	// Status is the status sent: the contract's, the replayed or the handler's; 0
	// when the handler runs after the decision or panicked.
	Status int
	// Duration runs from arrival to the decision (to the response's end when
	// executed).
	Duration time.Duration
	// StoreDuration is the time spent in store calls within Duration.
	StoreDuration time.Duration
	// RecordFailed: the outcome could not be settled in the store. Hit: the
	// claim found a live row (idempotency_hit_total); Miss: it won the claim
	// (idempotency_miss_total).
	RecordFailed, Hit, Miss bool
	StoreReason             string // the Reason of the store error that failed the claim of a rejected or bypassed request
}

// observe reports the request's decision to Config.Observer, once.
func (rq *request) observe(o Outcome, reason string, status int) {
	if rq.m.cfg.Observer == nil || rq.observed {
		return
	}
	rq.observed = true
	rq.m.cfg.Observer(rq.ctx, Observation{
		Outcome: o, Reason: reason, Endpoint: rq.label, Scope: rq.m.identifier(rq.claim.Scope), Status: status,
		Duration: time.Since(rq.start), StoreDuration: rq.storeTime, RecordFailed: rq.recordFailed,
		Hit: rq.hit, Miss: rq.miss,
		StoreReason: rq.storeReason,
	})
}

// observeAnswer reports one of the contract's answers.
func (rq *request) observeAnswer(a answer) {
	ans := &answers[a]
	switch ans.counter {
	case countRejection:
		rq.observe(OutcomeRejected, ans.reason, ans.status)
	case countConflict:
		rq.observe(OutcomeConflict, ans.reason, ans.status)
	case countTooLarge:
		rq.observe(OutcomeExecuted, "response_too_large", ans.status)
	}
}

// settledReason names an outcome that was settled.
func settledReason(o outcome) string {
	switch o {
	case outcomeFail:
		return "failed"
	case outcomeRelease:
		return "released"
	}
	return "completed"
}

// observeUnrun reports a request whose handler runs without a claim.
func (rq *request) observeUnrun(o Outcome, reason string) {
	rq.observe(o, reason, 0)
}
