package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
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
// answer, by the class of its reason (failureOf): contention is in flight,
// a refused value is 400, a possible outage (connection, timeout) is 503 on
// a fail-closed route and, on a fail-open one, a bypass only when the
// outage probe failed too, and every other class is 503 on both.
func (rq *request) claimFailed(err error) {
	reason := storeReason(err)
	rq.storeReason = reason
	switch reason {
	case ReasonConflict:
		// Contention, not an outage: other requests keep changing this
		// key's row (serialization failures past the retries, a takeover
		// lost every round). One of them owns the key, so a fail-open
		// bypass would run the handler beside it: the key is in flight.
		rq.answer(answerInFlight)
		return
	case ReasonData:
		// A store that refuses this request's values is not down: it
		// would refuse every retry alike, so a fail-open bypass would run
		// each one, and a 503 would invite retries that cannot succeed.
		rq.logClaimFailure(slog.LevelWarn, "idempotency: the store refused the request's scope or endpoint", reason, err)
		rq.answer(answerInvalidScope)
		return
	case ReasonUnseal:
		// The key's row holds a response that does not open: 503 on every
		// policy (never an outage), logged with the row and its key id.
		rq.refuseUnsealed(err)
		return
	}
	f := failureOf(reason)
	if f.outage && rq.policy.failOpen && rq.probeFailed() {
		rq.bypass(f, reason, err)
		return
	}
	rq.logClaimFailure(f.level, f.msg+", rejecting", reason, err)
	rq.cause = err
	rq.answer(answerUnavailable)
	rq.giveBackLost(err) // the handler never ran: free the key if the claim landed
}

// opProbe is the outage probe's store-call operation.
const opProbe = "probe"

// probeFailed runs the store's outage probe (Store.Probe, a store call of
// its own under the store timeout) and reports whether it found the
// database unreachable: the only evidence a bypass needs. A probe that
// could not decide is no such evidence.
func (rq *request) probeFailed() bool {
	_, err := storeCall(rq, opProbe, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, rq.m.store.Probe(ctx)
	})
	return err != nil && storeReason(err) == ReasonConnection
}

// bypass runs the handler without deduplication. Every bypass is counted;
// the log is rate-limited per endpoint (one WARN a second, with the count
// of the bypasses logged at DEBUG since), never the decision.
func (rq *request) bypass(f failure, reason string, err error) {
	level, msg := slog.LevelWarn, f.msg+", the outage probe failed: running without deduplication"
	if n, first := rq.rm.bypassLog.take(time.Now()); !first {
		level = slog.LevelDebug
	} else if n > 0 {
		msg += fmt.Sprintf(" (%d more bypasses of this endpoint logged at DEBUG in the last second)", n)
	}
	rq.logClaimFailure(level, msg, reason, err)
	rq.m.metrics.bypasses.WithLabelValues(rq.label, reasonStoreUnavailable).Inc()
	rq.observeUnrun(OutcomeBypassed, reasonStoreUnavailable)
	rq.t.pass(true)
}

// logLimiter lets one log line a second through, and counts the others.
type logLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// take reports whether a line at now is the second's first, and how many
// were held back since the last first.
func (l *logLimiter) take(now time.Time) (suppressed int, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		return 0, false
	}
	suppressed, l.last, l.suppressed = l.suppressed, now, 0
	return suppressed, true
}

// failure is how a claim that failed with one class of reason is logged,
// and whether it may be an outage, the only class for which a fail-open
// route runs the outage probe.
type failure struct {
	outage bool
	level  slog.Level
	msg    string
}

// failureOf returns the class of a store-error reason. A reason of no
// known class, such as another store's own, is never an outage.
func failureOf(reason string) failure {
	switch reason {
	case ReasonTimeout, ReasonConnection:
		return failure{true, slog.LevelWarn, "idempotency: store unavailable"} // the database did not answer: perhaps an outage
	case ReasonPoolExhausted:
		return failure{false, slog.LevelWarn, "idempotency: no pooled connection before the store timeout: every one in use, " +
			"or the pool still opening one (size the pool, or give these routes a pool of their own)"}
	case ReasonTooManyConnections:
		return failure{false, slog.LevelWarn, "idempotency: the database refused a new connection: too many connections"}
	case ReasonAuth, ReasonSchema, ReasonPermission:
		return failure{false, slog.LevelError, "idempotency: the store is misconfigured (the login, the table or a grant; " +
			"PostgresStore.Check names it): every request fails alike until it is fixed"}
	case ReasonLockTimeout:
		return failure{false, slog.LevelWarn, "idempotency: the claim waited past lock_timeout behind a table lock (DDL, a migration)"}
	case ReasonStatementTimeout:
		return failure{false, slog.LevelWarn, "idempotency: the database cancelled the claim at its statement timeout (a lock wait or a slow statement)"}
	case ReasonRemoteNode:
		return failure{false, slog.LevelWarn, "idempotency: the database answered that a node behind it failed or refused the connection (a Citus worker)"}
	case ReasonClosed:
		return failure{false, slog.LevelWarn, "idempotency: the store is closed"}
	case ReasonFull:
		// Any client can fill a memory store on purpose, and must not
		// earn a bypass by doing so.
		return failure{false, slog.LevelWarn, "idempotency: the memory store is full"}
	}
	return failure{false, slog.LevelWarn, "idempotency: the store failed"}
}

// logClaimFailure logs a failed claim with the request's key and scope (as
// Config allows: the logger redacts them), the reason and the error.
func (rq *request) logClaimFailure(level slog.Level, msg, reason string, err error) {
	rq.m.log.Log(rq.ctx, level, msg, "endpoint", rq.label, "scope", rq.claim.Scope, "key", rq.claim.Key,
		"operation", storeOp(err), "reason", reason, "error", err)
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
	if rq.policy.txStore == nil {
		rq.t.pass(false)
		return
	}
	rq.run(nil, time.Time{}, nil)
}
