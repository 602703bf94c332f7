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
//
// On a transactional route each round runs inside the transaction its
// handler will write through (TxStore.BeginClaim): won, the transaction
// stays open and holds the claim; a round that ends without one rolls it
// back. A claim that waited past the route's lock wait for an owner still
// mid-handler fails as contention (409 in flight).
func (rq *request) claimKey() (claimed, error) {
	// The lease is counted from the first call: a row this request won by
	// its owner token (the store's retry after a lost reply) may have been
	// inserted then.
	rq.claimStart = time.Now()
	begin := rq.beginRound
	if rq.policy.txStore != nil {
		begin = rq.beginTxRound
	}
	for round := 1; ; round++ {
		r, res, err := begin()
		switch {
		case err != nil:
			return claimed{}, err
		case r.contended:
			rq.countHit() // the owner's transaction held the key past the lock wait
			return claimed{outcome: claimContended}, nil
		case res.Won:
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: r.claimedAt, tx: r.tx}, nil
		case !takeoverable(res.Record):
			r.end()
			rq.countHit()
			return claimed{outcome: claimDuplicate, record: res.Record}, nil
		case round == maxClaimRounds:
			r.end()
			rq.countHit() // others keep winning this key: it is in flight
			return claimed{outcome: claimContended}, nil
		}
		fence := res.Record.Fence()
		res, err = rq.storeClaim("takeover", func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
			return r.takeover(ctx, fence, req)
		})
		switch {
		case err != nil:
			r.end()
			return claimed{}, err
		case res.Won:
			rq.countMiss()
			return claimed{outcome: claimWon, record: res.Record, claimedAt: r.claimedAt, tx: r.tx}, nil
		case res.Lost:
			r.end()
			continue // read the row again: the last round answers in flight
		}
		r.end()
		rq.countHit()
		return claimed{outcome: claimDuplicate, record: res.Record}, nil
	}
}

// claimRound is one round of claimKey in its mode: the ordinary store's,
// or a transactional route's inside the transaction the round began.
type claimRound struct {
	claimedAt time.Time // when a claim won in this round began (the lease's start)
	tx        RouteTx   // transactional: the round's transaction
	contended bool      // transactional: the claim waited past the lock wait
	takeover  func(context.Context, Fence, ClaimRequest) (ClaimResult, error)
	end       func() // ends a round that holds no claim
}

// beginRound claims the key on the ordinary store.
func (rq *request) beginRound() (claimRound, ClaimResult, error) {
	r := claimRound{claimedAt: rq.claimStart, takeover: rq.m.store.Takeover, end: func() {}}
	res, err := rq.storeClaim("claim", rq.m.store.Claim)
	return r, res, err
}

// beginTxRound claims the key in a new transaction of the route's
// TxStore; the round takes over and ends inside it.
func (rq *request) beginTxRound() (claimRound, ClaimResult, error) {
	r := claimRound{claimedAt: time.Now()}
	res, err := rq.storeClaim("begin", func(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
		t, res, err := rq.policy.txStore.BeginClaim(ctx, &req)
		r.tx = t
		return res, err
	})
	if err != nil || r.tx == nil {
		r.contended = err == nil
		return r, res, err
	}
	tx := r.tx
	r.takeover = tx.Takeover
	r.end = func() { rq.endTx(tx) }
	return r, res, nil
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

// takeoverable reports a row that is a new key for a claim: expired, not
// a tombstone, and not in flight inside its lease.
func takeoverable(rec Record) bool {
	return rec.Expired && !rec.Tombstone && (rec.Status != StatusInFlight || rec.LeaseOver)
}

// tombstone reports a row answered 422 idempotency_key_expired: a
// tombstone (the row's retain_until decides, whatever the route's
// ExpiredPolicy), once no lease runs on it.
func tombstone(rec Record) bool {
	return rec.Tombstone && (rec.Status != StatusInFlight || rec.LeaseOver)
}

// storeClaim runs one claiming store call for the request.
func (rq *request) storeClaim(op string, call func(context.Context, ClaimRequest) (ClaimResult, error)) (ClaimResult, error) {
	return storeCall(rq, op, func(ctx context.Context) (ClaimResult, error) {
		return call(ctx, rq.claim)
	})
}
