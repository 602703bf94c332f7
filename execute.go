package idempotency

import (
	"context"
	"math"
	"time"
)

// execution is one run of a call's handler: for the winner of a claim
// (owned), or unclaimed on a transactional route, which gives every call
// its transaction. It is the only code that runs a handler into a held
// result; how its outcome is settled is its settlement's.
type execution struct {
	*request
	owned     bool
	fence     Fence        // owned: the claim's fence
	own       Record       // owned: the claimed row, which the record is bound to
	claimed   time.Time    // owned: when the claim was made
	leaseEnd  time.Time    // owned: the end of the claim's lease
	tx        RouteTx      // transactional routes: the handler's transaction
	closeTx   func()       // transactional routes: ends the handler's loan of tx
	mark      *handlerMark // what the handler said besides its result (Unsettled)
	hb        *heartbeat   // Heartbeat routes: renews the lease while the handler runs
	leaseLost bool         // Heartbeat routes: the lease was lost; nothing is recorded
	how       settlement   // ordinary, or transactional
}

// settlement is how a run's outcome reaches the store: ordinary (the fenced
// Store.Complete, Fail or Release after the handler returned: settle.go) or
// transactional (the record commits with the handler's writes:
// settle_tx.go).
type settlement interface {
	// giveBack gives back a won key whose handler never ran.
	giveBack(x *execution)
	// panicked settles a handler that panicked (or called runtime.Goexit).
	panicked(x *execution)
	// conclude settles a handler that returned, and delivers its result or
	// the answer that replaces it.
	conclude(x *execution)
}

// execute runs the handler of a won claim, settles its outcome, then
// delivers the result. tx is the transaction that holds a transactional
// route's claim.
func (rq *request) execute(own Record, claimedAt time.Time, tx RouteTx) {
	rq.run(&own, claimedAt, tx)
}

// run runs the handler, for the claim own (nil: unclaimed) made at
// claimedAt (in tx on a transactional route): transaction, deadline, held
// result, panic, settle.
func (rq *request) run(own *Record, claimedAt time.Time, tx RouteTx) {
	x := &rq.run0
	*x = execution{request: rq, tx: tx, how: ordinary{}}
	if own != nil {
		x.owned, x.fence, x.own, x.claimed, x.leaseEnd = true, own.Fence(), *own, claimedAt, claimedAt.Add(rq.m.cfg.Lease)
		x.fence.wake = rq.policy.waitInFlight > 0
	}
	if rq.policy.txStore != nil {
		x.how = transactional{}
		if tx == nil && !x.begin() {
			return
		}
	}
	if x.owned && x.tooLate() {
		x.giveBack()
		return
	}
	ctx, cancel := x.handlerContext()
	defer cancel()
	finished := false
	defer func() {
		if !finished {
			x.handlerDone()
			p := recover()
			x.how.panicked(x)
			if p != nil { // nil: runtime.Goexit, which carries on by itself
				panic(p)
			}
		}
	}()
	x.t.handle(ctx, x.recordLimit(), x.tx != nil)
	finished = true
	x.handlerDone()
	cancel()
	x.how.conclude(x)
}

// handlerContext is the handler's context. A claim's handler has its key,
// is detached from the caller (a client that hangs up does not cancel an
// order half-way) and must finish in time for its outcome to be settled
// inside the lease; on a Heartbeat route it runs until MaxRun while the
// heartbeat renews the lease, and is cancelled when the lease is lost. A
// transactional route lends it the transaction.
func (x *execution) handlerContext() (context.Context, context.CancelFunc) {
	ctx, cancel := x.ctx, context.CancelFunc(func() {})
	switch {
	case x.owned && x.policy.heartbeat:
		ctx = x.withKey(ctx, x.own)
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(context.WithoutCancel(ctx), x.claimed.Add(x.policy.maxRun))
		var lose context.CancelCauseFunc
		ctx, lose = context.WithCancelCause(ctx)
		x.startHeartbeat(lose)
		cancel = func() { lose(nil); stop() }
	case x.owned:
		ctx = x.withKey(ctx, x.own)
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), x.leaseEnd.Add(-x.m.cfg.StoreTimeout))
	}
	ctx = x.withMark(ctx)
	if x.tx != nil {
		ctx, x.closeTx = x.tx.Lend(ctx)
	}
	return ctx, cancel
}

// handlerDone ends the handler's loan of its transaction once the handler
// returned (or panicked): from then on only the engine uses the
// connection, and a handler that kept the transaction is refused. On a
// Heartbeat route it stops the renewals.
func (x *execution) handlerDone() {
	if x.closeTx != nil {
		x.closeTx()
	}
	if x.hb != nil {
		// The record must land inside the lease the heartbeat confirmed last.
		x.leaseEnd, x.leaseLost = x.hb.end()
		x.hb = nil
	}
}

// recordLimit is how much of the handler's result is held for the record:
// the route's response limit on an owned run, nothing on an unclaimed one.
func (x *execution) recordLimit() int64 {
	if x.owned {
		return x.policy.maxResponse
	}
	return 0
}

// tooLate reports whether the handler's deadline (the lease's end less the
// store timeout) passed before it could start, because the claim (or a
// transactional route's BEGIN) was slow. Such a handler is not run with a
// dead context, which would settle its failure against the key: the key is
// given back instead (giveBack).
func (x *execution) tooLate() bool {
	return !time.Now().Before(x.leaseEnd.Add(-x.m.cfg.StoreTimeout))
}

// giveBack releases a won key whose handler never ran and asks the caller
// to retry.
func (x *execution) giveBack() {
	x.how.giveBack(x)
	x.m.log.WarnContext(x.ctx, "idempotency: the store was too slow to leave the handler any time; key given back",
		"endpoint", x.claim.Endpoint, "key", x.claim.Key)
	x.answer(answerUnavailable)
}

// statusTooManyRequests is HTTP's 429: the handler declined to run, so its
// key is released. Every adapter's status is HTTP's or maps to it.
const statusTooManyRequests = 429

// classify maps the handler's status to the outcome to settle: a 429, or
// any answer below 500 on a NoStore route, gives the key back. (A
// transaction that ended under its handler is never classified: see
// endedUnderHandler.)
func (x *execution) classify(status int) outcome {
	switch {
	case status == statusTooManyRequests, x.policy.noStore && status < 500:
		return outcomeRelease
	case status >= 500:
		return x.failed()
	}
	return outcomeComplete
}

// failed is the outcome of a handler that failed (>= 500 or panic):
// released on a transactional route with ReleaseOnError, whose rollback
// proves nothing happened, else failed.
func (x *execution) failed() outcome {
	if x.policy.releaseOnError {
		return outcomeRelease
	}
	return outcomeFail
}

// txBufferFactor is how many times its MaxResponseBytes a transactional
// route holds at most: nothing may be sent before the commit, so the
// whole result waits in memory.
const txBufferFactor = 4

// bufferCap is a transactional route's buffer cap for a response limit.
func bufferCap(maxResponse int64) int64 {
	if maxResponse > math.MaxInt64/txBufferFactor {
		return math.MaxInt64
	}
	return txBufferFactor * maxResponse
}

// outcome is what settling writes to a claimed key.
type outcome int

const (
	outcomeComplete outcome = iota // Store.Complete, with the response
	outcomeFail                    // Store.Fail
	outcomeRelease                 // Store.Release
)
