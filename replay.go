package idempotency

import (
	"context"
	"time"
)

// ReplayEvent describes one replay, for OnReplay (an HTTP duplicate's
// request is RequestFromContext's).
type ReplayEvent struct {
	Key            string    // the normalised idempotency key
	Scope          string    // the user scope
	Endpoint       string    // the scope_endpoint: "POST /orders", "do:settle-payment"
	Adapter        string    // the entry point: "http", "do", or an adapter's (Operation)
	RequestHash    string    // the request hash, the original's and the duplicate's
	OriginalStatus int       // the status being replayed
	OriginalTime   time.Time // when the original request claimed the key
}

// replay sends a completed key's stored response, once the host's replay
// hook has audited it.
func (rq *request) replay(rec Record) {
	if err := rq.auditReplay(rec); err != nil {
		if !rq.policy.failOpen {
			rq.m.log.ErrorContext(rq.ctx, "idempotency: replay hook failed; replay refused",
				"endpoint", rq.claim.Endpoint, "key", rq.claim.Key, "error", err)
			rq.cause = err
			rq.answer(answerUnavailable)
			return
		}
		rq.m.log.WarnContext(rq.ctx, "idempotency: replay hook failed; replaying anyway (fail-open route)",
			"endpoint", rq.claim.Endpoint, "key", rq.claim.Key, "error", err)
	}
	rq.rm.replay.Inc()
	if rec.Response.plaintext {
		rq.m.metrics.plaintextReplays.WithLabelValues(rq.label).Inc()
	}
	rq.observe(OutcomeReplayed, "", rec.Response.Status)
	rq.t.replay(rec.Response)
}

// auditReplay calls Config.OnReplay, if set, detached from the client and
// bounded by the store timeout.
func (rq *request) auditReplay(rec Record) error {
	hook := rq.m.cfg.OnReplay
	if hook == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rq.t.auditContext()), rq.m.cfg.StoreTimeout)
	defer cancel()
	return hook(ctx, ReplayEvent{
		Key: rq.claim.Key, Scope: rq.claim.Scope, Endpoint: rq.claim.Endpoint, Adapter: rq.adapter, RequestHash: rec.RequestHash,
		OriginalStatus: rec.Response.Status, OriginalTime: rec.CreatedAt,
	})
}
