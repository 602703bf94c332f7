package idempotency

import (
	"context"
	"errors"
)

// transactional is the settlement of a transactional route (docs/transactional.md,
// "Transactional routes"): the claim was made inside the transaction the
// handler writes through (claimKeyTx), and the record commits with the
// handler's writes. Failure paths roll back to the savepoint taken after
// the claim and record in the same transaction, so the key is never free
// for a waiting duplicate; only 429 and the release option roll back
// whole. Nothing is delivered before the commit, and nothing touches the
// transaction while the handler may still use it.
type transactional struct{}

// giveBack rolls the claim back with the transaction.
func (transactional) giveBack(x *execution) { x.abort() }

// panicked settles a handler that panicked: failed, back to the savepoint
// (or released under the release option).
func (transactional) panicked(x *execution) {
	if x.endedUnderHandler(x.checkState()) {
		return
	}
	o := x.failed()
	x.settleTx(o, Response{})
	if x.owned {
		x.observe(OutcomeExecuted, settledReason(o), 0)
	}
}

// conclude settles a handler that returned (concludeTx).
func (transactional) conclude(x *execution) { x.concludeTx() }

// begin starts the transaction of an unclaimed run (no key, or the
// kill-switch off): a BEGIN that fails answers 503.
func (x *execution) begin() bool {
	tx, _, err := storeCallTx(x, "begin", nil)
	if err == nil {
		x.tx = tx
		return true
	}
	x.m.log.WarnContext(x.ctx, "idempotency: cannot begin the route's transaction", "endpoint", x.label, "error", err)
	x.answer(answerUnavailable)
	return false
}

// storeCallTx runs BeginClaim for req as the store call op.
func storeCallTx(x *execution, op string, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	var tx RouteTx
	res, err := storeCall(x.request, op, func(ctx context.Context) (ClaimResult, error) {
		t, r, err := x.policy.txStore.BeginClaim(ctx, req)
		tx = t
		return r, err
	})
	return tx, res, err
}

// abort rolls the run's whole transaction back (the claim with it), if it
// has one. A rollback that fails leaves nothing behind: the server rolls
// back when the connection goes.
func (x *execution) abort() {
	if x.tx != nil {
		x.endTx(x.tx)
	}
}

// concludeTx settles a transactional run whose handler returned, then
// sends its response or the answer that replaces it.
func (x *execution) concludeTx() {
	if x.endedUnderHandler(x.checkState()) {
		return
	}
	if x.unsettled() {
		x.unsettle()
		return
	}
	if x.t.tooLarge() { // nothing was sent
		if x.settleTx(outcomeFail, Response{}) {
			x.answerTooLarge()
		}
		return
	}
	o := x.classify(x.t.status())
	resp := Response{}
	if o == outcomeComplete {
		resp = x.t.result()
	}
	if x.settleTx(o, resp) {
		x.t.send()
		if x.owned {
			x.observe(OutcomeExecuted, settledReason(o), x.t.status())
		}
	}
}

// settleTx settles outcome o of a transactional run and reports whether
// the handler's own result may be delivered; when it may not, the caller
// has its answer already.
//
// Completed from an open transaction: the record and COMMIT. Failed, or
// any answer from an aborted transaction: back to the savepoint, then the
// record and COMMIT. Released (429, the release option): a full rollback.
// Unclaimed runs commit or roll back alone. The transaction is still there
// (open or aborted): one that ended under the handler never gets here
// (endedUnderHandler).
func (x *execution) settleTx(o outcome, resp Response) bool {
	x.releasing(o)
	state := x.tx.State()
	switch {
	case !x.owned && o == outcomeComplete && state == TxOpen:
		return x.commit(nil)
	case !x.owned, o == outcomeRelease:
		x.abort()
		return true
	}
	s := &Settlement{Fence: x.fence, Owner: x.own, Failed: o == outcomeFail, Undo: o == outcomeFail || state == TxAborted, Response: resp}
	if s.Failed {
		s.Response = Response{}
	}
	return x.commit(s)
}

// commit commits the run's transaction with settlement s (nil: unclaimed).
// When the record fails before COMMIT with the transaction still open,
// whatever the handler left behind caused it (a deferred constraint it
// violated, a trigger's error, a read-only transaction, a row of the key
// it changed): the writes are undone and the key recorded failed, and the
// client gets 409 idempotency_previous_failed, as every retry will; never
// a 503 whose retry would run the handler again. When even that record
// cannot be written, or the commit fails (or its reply is lost),
// everything is rolled back, and the client gets 503: the row decides
// whether the handler's writes committed. So does a response that cannot
// be sealed (sealingTx): the keys failed, not the handler, and the retry
// executes once they work.
func (x *execution) commit(s *Settlement) bool {
	err := x.commitOnce(s)
	if x.handlersRecordFailure(s, err) {
		msg := "idempotency: the record failed on the state the handler left its transaction in; writes rolled back, key failed"
		if errors.Is(err, ErrDeferredConstraint) {
			msg = "idempotency: the handler's writes violate a deferred constraint; writes rolled back, key failed"
		}
		x.m.log.ErrorContext(x.ctx, msg, "endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key, "error", err)
		if err = x.commitOnce(&Settlement{Fence: s.Fence, Owner: s.Owner, Failed: true, Undo: true}); err == nil {
			x.answer(answerPreviousFailed)
			return false
		}
	}
	if err == nil {
		return true
	}
	unwritable := s != nil && x.txLive()
	x.abort()
	switch {
	case unwritable:
		x.m.log.ErrorContext(x.ctx, "idempotency: the key's record cannot be written; everything rolled back, the retry executes",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key, "reason", storeReason(err), "error", err)
	case x.owned:
		x.m.log.ErrorContext(x.ctx, "idempotency: commit failed; the handler ran, the retry replays if it committed and executes if not",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key, "reason", storeReason(err), "error", err)
	default:
		x.m.log.ErrorContext(x.ctx, "idempotency: commit failed", "endpoint", x.label, "error", err)
	}
	if x.owned {
		x.rm.settleFailures.Inc()
		x.recordFailed = true
	}
	x.cause = err
	x.answer(answerUnavailable)
	return false
}

// commitOnce runs RouteTx.Commit as the store call "commit". A record
// that fails before COMMIT with the transaction still open is not counted
// as a store error: the handler's state caused it, unless the failed
// record that follows fails too.
func (x *execution) commitOnce(s *Settlement) error {
	var err error
	_, _ = storeCall(x.request, "commit", func(ctx context.Context) (struct{}, error) {
		if err = x.tx.Commit(ctx, s); x.handlersRecordFailure(s, err) {
			return struct{}{}, nil
		}
		return struct{}{}, err
	})
	return err
}

// handlersRecordFailure reports a completed record s that failed with err
// before COMMIT, the transaction still open: the state the handler left
// caused it, and the key is recorded failed instead. Not a response that
// could not be sealed, which fails before the store is asked.
func (x *execution) handlersRecordFailure(s *Settlement, err error) bool {
	return err != nil && s != nil && !s.Failed && storeReason(err) != ReasonSeal && x.txLive()
}

// txLive reports a transaction still open after a failed Commit: its
// COMMIT was never sent (one that failed ends the transaction, one whose
// reply was lost closes the connection).
func (x *execution) txLive() bool {
	state := x.tx.State()
	return state == TxOpen || state == TxAborted
}

// checkState reads how the handler left its transaction and logs what
// went wrong: the transaction ended under the handler (endedUnderHandler
// answers for it), or the handler answered success from an aborted
// transaction (its writes did not happen). The handler has returned, so
// nothing else uses the connection.
func (x *execution) checkState() TxState {
	state := x.tx.State()
	status := x.t.status()
	switch {
	case state == TxEnded:
		x.m.log.ErrorContext(x.ctx, "idempotency: the route's transaction ended under the handler (its own COMMIT or ROLLBACK, "+
			"or the server rolled it back); its answer is replaced by 503", "endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key, "status", status)
	case state == TxAborted && status < 400 && !x.t.tooLarge():
		x.m.log.WarnContext(x.ctx, "idempotency: the handler answered success from an aborted transaction; its writes did not happen",
			"endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key, "status", status)
	case state == TxClosed:
		x.m.log.ErrorContext(x.ctx, "idempotency: the route's transaction ended under the handler: its connection closed (a statement past its deadline, "+
			"or the session ended) and everything rolled back, the claim included; its answer is replaced by 503",
			"endpoint", x.label, "scope", x.claim.Scope, "key", x.claim.Key, "status", status)
	}
	return state
}

// endedUnderHandler answers a run whose transaction ended under its
// handler (state TxEnded or TxClosed) and reports whether it did: a
// transactional answer follows its commit, so the client gets 503, never
// the handler's answer. The row decides what the retry gets. Nothing
// committed (a ROLLBACK, a closed connection): the key is free and the
// retry executes. The claim committed with the handler's own COMMIT: its
// lease is ended (RouteTx.EndLease) and nothing else recorded, so the
// retry answers idempotency_outcome_unknown and never runs again.
func (x *execution) endedUnderHandler(state TxState) bool {
	if state != TxEnded && state != TxClosed {
		return false
	}
	x.abort()
	if state == TxEnded {
		x.cause = ErrTxEnded // Do's error says so, besides ErrStoreUnavailable
		if x.owned {
			x.endLease()
		}
	}
	x.answer(answerUnavailable)
	return true
}

// endLease ends the lease of a claim the handler may have committed. One
// that cannot be ended runs out by itself: until then the retry answers
// 409 in flight, then outcome_unknown, so the key is never run again.
func (x *execution) endLease() {
	_, err := storeCall(x.request, "end_lease", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, x.tx.EndLease(ctx, x.fence)
	})
	switch {
	case errors.Is(err, ErrNotOwner):
		x.m.log.ErrorContext(x.ctx, "idempotency: nothing of the handler's transaction committed; the key is free and the retry executes",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key)
	case err != nil:
		x.m.log.ErrorContext(x.ctx, "idempotency: could not end the lease of a claim the handler may have committed; the retry answers in flight until the lease ends, then outcome unknown",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key, "reason", storeReason(err), "error", err)
		x.rm.settleFailures.Inc()
		x.recordFailed = true
	default:
		x.m.log.ErrorContext(x.ctx, "idempotency: the handler committed the claim itself; lease ended, the retry answers outcome unknown",
			"endpoint", x.claim.Endpoint, "scope", x.claim.Scope, "key", x.claim.Key)
	}
}

// answerTooLarge answers a transactional response over the buffer cap,
// whose writes were rolled back.
func (x *execution) answerTooLarge() {
	x.m.log.ErrorContext(x.ctx, "idempotency: response over the transactional route's buffer cap; writes rolled back",
		"endpoint", x.label, "cap_bytes", bufferCap(x.policy.maxResponse))
	x.answer(answerResponseTooLarge)
}
