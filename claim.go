package idempotency

import (
	"context"
	"time"
)

// claimOutcome is how a claim ended, when the store answered.
type claimOutcome int

const (
	// claimWon: this request owns the key and runs the handler.
	claimWon claimOutcome = iota
	// claimDuplicate: the key belongs to a live record, which decides the
	// answer.
	claimDuplicate
	// claimContended: others kept winning the key's expired or stale row
	// from under this request: the key is in flight.
	claimContended
)

// claimed is the result of claimKey.
type claimed struct {
	outcome   claimOutcome
	record    Record    // claimWon: the owned row; claimDuplicate: the live row
	claimedAt time.Time // claimWon: when the winning call began (the lease's start)
}

// maxClaimRounds bounds the claim loop: a takeover or reclaim that loses
// its race claims again, which can only repeat while other requests keep
// winning the same key.
const maxClaimRounds = 4

// claimKey claims the request's key: a new key is won at once; an expired
// row is taken over, and a stale row of a transactional route reclaimed,
// each fenced on the row it read, claiming again when that race is lost.
// It counts the request as a miss (won) or a hit (any other outcome).
func (rq *request) claimKey() (claimed, error) {
	// The lease is counted from the first call: a row this request won by
	// its owner token (the store's retry after a lost reply) may have been
	// inserted then.
	rq.claimStart = time.Now()
	claimedAt := rq.claimStart
	for round := 1; ; round++ {
		res, err := rq.storeClaim("claim", rq.m.store.Claim)
		if err != nil {
			return claimed{}, err
		}
		if res.Won {
			rq.rm.miss.Inc()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt}, nil
		}
		op, next := rq.reuse(res.Record)
		if next == nil {
			rq.rm.hit.Inc()
			return claimed{outcome: claimDuplicate, record: res.Record}, nil
		}
		if round == maxClaimRounds {
			rq.rm.hit.Inc() // others keep winning this key: it is in flight
			return claimed{outcome: claimContended}, nil
		}
		fence := res.Record.Fence()
		res, err = rq.storeClaim(op, func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
			return next(ctx, fence, req)
		})
		switch {
		case err != nil:
			return claimed{}, err
		case res.Won:
			rq.rm.miss.Inc()
			rq.logReclaim(op, res.Record)
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt}, nil
		case lostRace(res):
			continue // read the row again: the last round answers in flight
		}
		rq.rm.hit.Inc()
		return claimed{outcome: claimDuplicate, record: res.Record}, nil
	}
}

// reuse returns how a row that is not this request's may still be claimed:
// an expired row is a new key (takeover); a stale in_flight row a
// transactional route claimed for this same request was rolled back and
// may be reclaimed. next is nil for a live row.
func (rq *request) reuse(rec Record) (op string, next func(context.Context, Fence, ClaimRequest) (ClaimResult, error)) {
	switch {
	case rec.Expired && (rec.Status != StatusInFlight || rec.LeaseOver):
		return "takeover", rq.m.store.Takeover
	case rq.rt.txStore != nil && rec.Reclaimable && rec.Status == StatusInFlight && rec.LeaseOver &&
		rec.RequestHash == rq.claim.RequestHash:
		// Only rows a transactional route claimed: another owner's
		// effects did not roll back with it.
		return "reclaim", rq.m.store.Reclaim
	}
	return "", nil
}

// lostRace reports a takeover or reclaim that lost its race: by the Store
// contract, no win and no row (ClaimResult.Record.ID is 0).
func lostRace(res ClaimResult) bool { return !res.Won && res.Record.ID == 0 }

// logReclaim warns of a reclaimed key, whose previous attempt rolled back.
func (rq *request) logReclaim(op string, rec Record) {
	if op == "reclaim" {
		rq.m.log.WarnContext(rq.r.Context(), "idempotency: reclaimed a stale key; its previous attempt's transaction rolled back",
			"endpoint", rq.claim.Endpoint, "scope", rq.claim.Scope, "key", rq.claim.Key, "attempt", rec.Attempt)
	}
}

// storeClaim runs one claiming store call for the request.
func (rq *request) storeClaim(op string, call func(context.Context, ClaimRequest) (ClaimResult, error)) (ClaimResult, error) {
	return storeCall(rq, op, func(ctx context.Context) (ClaimResult, error) {
		return call(ctx, rq.claim)
	})
}

// answerAsLoser answers a transactional request whose key was reclaimed
// while its handler ran (its writes rolled back): it reads the key again
// and answers as a duplicate would, the reclaimer's replay once it
// completed, else 409 in flight.
func (rq *request) answerAsLoser() {
	res, err := rq.storeClaim("claim", rq.m.store.Claim)
	switch {
	case err != nil:
		rq.claimFailed(err)
	case res.Won:
		// The row vanished (erased or cleaned up) and this claim took the
		// key: nothing ran under it, so give it back and ask for a retry.
		rq.settle(res.Record.Fence(), outcomeRelease, Response{}, time.Now().Add(rq.m.cfg.Lease))
		rq.answer(answerInFlight)
	default:
		// Already counted as a miss when it claimed: no hit on top.
		rec := res.Record
		if rec.Status == StatusInFlight {
			rec.LeaseOver = false // its new owner holds a fresh lease
		}
		rq.answerDuplicate(rec)
	}
}
