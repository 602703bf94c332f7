package idempotency

import (
	"context"
	"time"
)

// maxForgetting bounds how many claims of unknown outcome are being
// forgotten at once: during an outage every failed claim would otherwise
// start a loop of its own.
const maxForgetting = 256

// unknownOutcome reports whether a failed claim may have committed all the
// same: its deadline fired or its connection went before the reply came.
// Contention, refused values and a full or closed store changed nothing.
func unknownOutcome(reason string) bool {
	switch reason {
	case ReasonTimeout, ReasonConnection, ReasonOther:
		return true
	}
	return false
}

// forgetClaim frees, in the background, the row a failed claim of this
// request may have left in flight although its handler never ran (the
// INSERT committed, its reply was lost): without it the key would answer
// 409 in flight, then idempotency_outcome_unknown, until it expired. Only
// a row carrying this request's owner token is ever deleted, so another
// request's claim is never touched. It keeps trying until the store
// answers, or the lease the claim would have held ends.
func (rq *request) forgetClaim(err error) {
	rel, ok := rq.m.store.(OwnerReleaser)
	if !ok || !unknownOutcome(storeReason(err)) || rq.rt.txStore != nil {
		// A transactional route's claim never commits alone: it rolled
		// back with its transaction.
		return
	}
	select {
	case rq.m.forgetting <- struct{}{}:
	default:
		rq.m.log.WarnContext(rq.r.Context(), "idempotency: too many claims of unknown outcome to free; this key may stay in flight",
			"endpoint", rq.label, "scope", rq.claim.Scope, "key", rq.claim.Key)
		return
	}
	until := rq.claimStart.Add(rq.claim.Lease)
	failedAt := time.Now()
	m, req, ctx := rq.m, rq.claim, context.WithoutCancel(rq.r.Context())
	go func() {
		defer func() { <-m.forgetting }()
		m.forget(ctx, rel, req, failedAt, until)
	}()
}

// forget asks rel to delete req's row by its owner token until it says
// whether there was one. An answer of "none" counts only once the lost
// claim must have ended on the server too (two store timeouts after it
// failed): before that, its INSERT may still commit.
func (m *Middleware) forget(ctx context.Context, rel OwnerReleaser, req ClaimRequest, failedAt, until time.Time) {
	backoff := 50 * time.Millisecond
	for {
		freed, err := timedCall(m, ctx, "release", func(c context.Context) (bool, error) {
			return rel.ReleaseOwner(c, req)
		})
		switch {
		case err == nil && freed:
			m.log.WarnContext(ctx, "idempotency: freed the key of a claim whose reply was lost; its handler never ran",
				"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key)
			return
		case err == nil && time.Since(failedAt) >= 2*m.cfg.StoreTimeout,
			storeReason(err) == ReasonClosed,
			time.Now().Add(backoff).After(until):
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}
