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
	tx        RouteTx   // claimWon on a transactional route: the transaction that holds the claim
}

// maxClaimRounds bounds the claim loop: a takeover that loses
// its race claims again, which can only repeat while other requests keep
// winning the same key.
const maxClaimRounds = 4

// claimKey claims the request's key: a new key is won at once; an expired
// row is taken over, fenced on the row it read, claiming again when that
// race is lost. It counts the request as a miss (won) or a hit (any other
// outcome).
func (rq *request) claimKey() (claimed, error) {
	// The lease is counted from the first call: a row this request won by
	// its owner token (the store's retry after a lost reply) may have been
	// inserted then.
	rq.claimStart = time.Now()
	if rq.policy.txStore != nil {
		return rq.claimKeyTx()
	}
	claimedAt := rq.claimStart
	for round := 1; ; round++ {
		res, err := rq.storeClaim("claim", rq.m.store.Claim)
		if err != nil {
			return claimed{}, err
		}
		if res.Won {
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt}, nil
		}
		if !takeoverable(res.Record) {
			rq.countHit()
			return claimed{outcome: claimDuplicate, record: res.Record}, nil
		}
		if round == maxClaimRounds {
			rq.countHit() // others keep winning this key: it is in flight
			return claimed{outcome: claimContended}, nil
		}
		fence := res.Record.Fence()
		res, err = rq.storeClaim("takeover", func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
			return rq.m.store.Takeover(ctx, fence, req)
		})
		switch {
		case err != nil:
			return claimed{}, err
		case res.Won:
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt}, nil
		case lostRace(res):
			continue // read the row again: the last round answers in flight
		}
		rq.countHit()
		return claimed{outcome: claimDuplicate, record: res.Record}, nil
	}
}

// claimKeyTx claims the key of a transactional route inside the
// transaction its handler will write through (TxStore.BeginClaim): won,
// the transaction stays open and holds the claim; an expired row is taken
// over inside it; any other row is answered as a duplicate, after the
// transaction is rolled back. A claim that waited past the route's lock
// wait for an owner still mid-handler fails as contention (409 in flight).
func (rq *request) claimKeyTx() (claimed, error) {
	for round := 1; ; round++ {
		claimedAt := time.Now()
		var tx RouteTx
		res, err := rq.storeClaim("begin", func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
			t, r, err := rq.policy.txStore.BeginClaim(ctx, &req)
			tx = t
			return r, err
		})
		if err != nil {
			return claimed{}, err
		}
		if tx == nil {
			// The owner's transaction held the key past the lock wait.
			rq.countHit()
			return claimed{outcome: claimContended}, nil
		}
		if res.Won {
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt, tx: tx}, nil
		}
		if !takeoverable(res.Record) || round == maxClaimRounds {
			rq.endTx(tx)
			rq.countHit()
			if takeoverable(res.Record) {
				return claimed{outcome: claimContended}, nil
			}
			return claimed{outcome: claimDuplicate, record: res.Record}, nil
		}
		fence := res.Record.Fence()
		res, err = rq.storeClaim("takeover", func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
			return tx.Takeover(ctx, fence, req)
		})
		switch {
		case err != nil:
			rq.endTx(tx)
			return claimed{}, err
		case res.Won:
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: claimedAt, tx: tx}, nil
		}
		rq.endTx(tx) // lost the race: read the row again in a new transaction
	}
}

// endTx rolls back a transaction that holds no claim. A rollback that
// fails leaves nothing behind: the server rolls back when the connection
// goes.
func (rq *request) endTx(tx RouteTx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rq.ctx), rq.m.cfg.StoreTimeout)
	defer cancel()
	_ = tx.Abort(ctx)
}

// countMiss counts a request that won its claim (idempotency_miss_total),
// and countHit one that found a live row (idempotency_hit_total), in the
// metrics and for the Observer alike, so that an Observer's counts can
// mirror Prometheus exactly.
func (rq *request) countMiss() { rq.rm.miss.Inc(); rq.miss = true }

func (rq *request) countHit() { rq.rm.hit.Inc(); rq.hit = true }

// takeoverable reports a row that is a new key for a claim: expired, and
// not in flight inside its lease.
func takeoverable(rec Record) bool {
	return rec.Expired && (rec.Status != StatusInFlight || rec.LeaseOver)
}

// lostRace reports a takeover that lost its race: by the Store contract,
// no win and no row (ClaimResult.Record.ID is 0).
func lostRace(res ClaimResult) bool { return !res.Won && res.Record.ID == 0 }

// storeClaim runs one claiming store call for the request.
func (rq *request) storeClaim(op string, call func(context.Context, ClaimRequest) (ClaimResult, error)) (ClaimResult, error) {
	return storeCall(rq, op, func(ctx context.Context) (ClaimResult, error) {
		return call(ctx, rq.claim)
	})
}
