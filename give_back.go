package idempotency

import (
	"context"
	"errors"
	"time"
)

// opReleaseOwner is the store operation of the background deletion of a
// lost claim's row by its owner token (Store.ReleaseOwner): not "release", which
// is a fenced release of a claim the request holds.
const opReleaseOwner = "release_owner"

// maxGivingBack bounds how many keys are being freed in the background at
// once (claims of unknown outcome, and won claims whose handler never
// ran): during an outage every failed claim would otherwise start a loop
// of its own.
const maxGivingBack = 256

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

// giveBackLost gives back, in the background, the row a failed claim of this
// request may have left in flight although its handler never ran (the
// INSERT committed, its reply was lost): without it the key would answer
// 409 in flight, then idempotency_outcome_unknown, until it expired. Only
// a row carrying this request's owner token is ever deleted, so another
// request's claim is never touched. It keeps trying until the store
// answers, or the lease the claim would have held ends.
func (rq *request) giveBackLost(err error) {
	if !unknownOutcome(storeReason(err)) || rq.policy.txStore != nil {
		// A transactional route's claim never commits alone: it rolled
		// back with its transaction.
		return
	}
	req := rq.claim
	// An answer of "none" counts only once the lost claim must have ended
	// on the server too (two store timeouts after it failed): before
	// that, its INSERT may still commit.
	noneAfter := time.Now().Add(2 * rq.m.cfg.StoreTimeout)
	rq.inBackground(opReleaseOwner, func(ctx context.Context) (bool, error) { return rq.m.store.ReleaseOwner(ctx, req) },
		noneAfter, rq.claimStart.Add(req.Lease), "idempotency: freed the key of a claim whose reply was lost; its handler never ran", "")
}

// giveBackWon gives back the key of a won claim whose handler never ran
// (execution.giveBack): tried for two store timeouts while the client waits for its
// 503, then in the background until the key's row would expire, so that a
// store slow for longer does not leave the key in flight (answering
// idempotency_outcome_unknown for its whole TTL although nothing ran). The
// release is fenced: a row finished or taken over since is left alone.
func (x *execution) giveBackWon(claimedAt time.Time) {
	store, f := x.m.store, x.fence
	release := func(ctx context.Context) (bool, error) {
		err := store.Release(ctx, f)
		if errors.Is(err, ErrNotOwner) {
			return false, nil // gone, or no longer this claim's
		}
		return err == nil, err
	}
	timed := func(ctx context.Context) (bool, error) { // the client waits: its store time
		start := time.Now()
		defer func() { x.storeTime += time.Since(start) }()
		return release(ctx)
	}
	if _, answered := x.m.giveBackRetrying(context.WithoutCancel(x.ctx), "release", timed, time.Time{}, time.Now().Add(2*x.m.cfg.StoreTimeout)); answered {
		return
	}
	x.m.log.WarnContext(x.ctx, "idempotency: could not release a key whose handler never ran; retrying in the background",
		"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key)
	x.inBackground("release", release, time.Time{}, claimedAt.Add(x.claim.TTL),
		"idempotency: released in the background a key whose handler never ran",
		"idempotency: gave up releasing a key whose handler never ran; it answers outcome_unknown until it expires")
}

// inBackground runs giveBackRetrying with giveBack (store operation op) in a goroutine
// of its own, within maxGivingBack; it logs freedMsg when it freed the key,
// and gaveUpMsg (unless "") when the store never answered.
func (rq *request) inBackground(op string, giveBack func(context.Context) (bool, error), noneAfter, until time.Time, freedMsg, gaveUpMsg string) {
	select {
	case rq.m.givingBack <- struct{}{}:
	default:
		rq.m.log.WarnContext(rq.ctx, "idempotency: too many keys to free in the background; this key may stay in flight",
			"endpoint", rq.label, "scope", rq.claim.Scope, "key", rq.claim.Key)
		return
	}
	m, req, ctx := rq.m, rq.claim, context.WithoutCancel(rq.ctx)
	go func() {
		defer func() { <-m.givingBack }()
		switch freed, answered := m.giveBackRetrying(ctx, op, giveBack, noneAfter, until); {
		case freed:
			m.log.WarnContext(ctx, freedMsg, "endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key)
		case !answered && gaveUpMsg != "":
			m.log.ErrorContext(ctx, gaveUpMsg, "endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key)
		}
	}()
}

// giveBackRetrying calls giveBack, timed and counted as store operation op, backing off,
// until it says whether it freed the row (an answer of "none" counts only
// after noneAfter), the store is closed, or another call could not end by
// until. It reports whether the row was freed, and whether the store
// answered at all.
func (m *Middleware) giveBackRetrying(ctx context.Context, op string, giveBack func(context.Context) (bool, error), noneAfter, until time.Time) (freed, answered bool) {
	backoff := 50 * time.Millisecond
	for {
		freed, err := timedCall(m, ctx, op, giveBack)
		switch {
		case err == nil && (freed || !time.Now().Before(noneAfter)):
			return freed, true
		case storeReason(err) == ReasonClosed, time.Now().Add(backoff + m.cfg.StoreTimeout).After(until):
			// The next call could not end by until.
			return false, false
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}
