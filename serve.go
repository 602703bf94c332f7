package idempotency

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// ServeHTTP takes one request through the route: admit it (the kill-switch,
// the key, the body, the scope), claim its key, then execute the handler if
// the claim was won, or answer as the key's record calls for.
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rq := rt.newRequest(w, r)
	if !rq.admit() {
		return
	}
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

// admit decides whether a request is claimed. It reports false when it has
// already dealt with the request: passed it through (kill-switch off, no
// key on an optional route) or refused it (400, 413).
func (rq *request) admit() bool {
	if !rq.m.cfg.Enabled(rq.r) {
		rq.name()
		rq.m.metrics.bypasses.WithLabelValues(rq.label, reasonDisabled).Inc()
		rq.observeUnrun(OutcomeBypassed, reasonDisabled)
		rq.passThrough()
		return false
	}
	key, present, ok := headerKey(rq.r, rq.rt.parseKey)
	if !present && !rq.rt.requireKey {
		if rq.m.cfg.Observer != nil {
			rq.name()
			rq.observeUnrun(OutcomePassThrough, "")
		}
		rq.passThrough()
		return false
	}
	rq.name()
	switch {
	case !present:
		rq.answer(answerMissingKey)
		return false
	case !ok:
		rq.answer(rq.rt.invalidKey)
		return false
	}
	body, err := readBody(rq.w, rq.r, rq.rt.maxBody, rq.m.cfg.BodyTimeout)
	switch {
	case errors.Is(err, errBodyTooLarge):
		rq.answer(answerBodyTooLarge)
		return false
	case err != nil:
		rq.answer(answerBodyUnreadable)
		return false
	}
	return rq.admitScope(key, body)
}

// admitScope builds the claim of a keyed request whose body was read, or
// refuses a scope or endpoint the store could not hold.
func (rq *request) admitScope(key string, body []byte) bool {
	scope := rq.m.cfg.Scope(rq.r)
	if !storable(scope) || !storable(rq.endpoint) {
		// A value the store cannot hold would fail every claim of this
		// key alike: refuse it rather than treat it as an outage (which a
		// fail-open route would run without deduplication, every time).
		rq.m.log.WarnContext(rq.r.Context(), "idempotency: scope or endpoint cannot be stored (not UTF-8, a NUL byte, or too long)",
			"endpoint", rq.label, "scope_bytes", len(scope), "endpoint_bytes", len(rq.endpoint))
		rq.answer(answerInvalidScope)
		return false
	}
	rq.claim = ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    rq.endpoint,
		RequestHash: requestHash(rq.r.Method, rq.r.URL.EscapedPath(), rq.r.URL.RawQuery, body),
		TTL:         rq.rt.ttl,
		Lease:       rq.m.cfg.Lease,
		LockWait:    rq.rt.txLockWait,
		Owner:       uuid.New(), // one per request: the store's retry of this claim knows its own row
	}
	rq.rm = rq.m.metricsFor(rq.label)
	return true
}

// claimFailed applies the route's policy to a claim the store could not
// answer, by the class of its reason (failureOf): contention is in flight,
// a refused value is 400, an outage is 503 on a fail-closed route and a
// bypass on a fail-open one, and every other class is 503 on both.
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
	if f.outage && rq.rt.failOpen {
		rq.logClaimFailure(slog.LevelWarn, f.msg+", running without deduplication", reason, err)
		rq.m.metrics.bypasses.WithLabelValues(rq.label, reasonStoreUnavailable).Inc()
		rq.observeUnrun(OutcomeBypassed, reasonStoreUnavailable)
		rq.rt.next.ServeHTTP(rq.w, rq.withKey())
		return
	}
	rq.logClaimFailure(f.level, f.msg+", rejecting", reason, err)
	rq.answer(answerUnavailable)
	rq.forgetClaim(err) // the handler never ran: free the key if the claim landed
}

// failure is how a claim that failed with one class of reason is logged,
// and whether it is an outage, the only class a fail-open route bypasses
// (DESIGN-settled-r3 items 1 and 2).
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
		return failure{true, slog.LevelWarn, "idempotency: store unavailable"} // the database did not answer: an outage
	case ReasonPoolExhausted:
		return failure{false, slog.LevelWarn, "idempotency: every pooled connection is in use and none is being opened " +
			"(pool saturation, not a slow database: size the pool, or give these routes a pool of their own)"}
	case ReasonTooManyConnections:
		return failure{false, slog.LevelWarn, "idempotency: the database refused a new connection: too many connections"}
	case ReasonAuth, ReasonSchema, ReasonPermission:
		return failure{false, slog.LevelError, "idempotency: the store is misconfigured (the login, the table or a grant; " +
			"PostgresStore.Check names it): every request fails alike until it is fixed"}
	case ReasonLockTimeout:
		return failure{false, slog.LevelWarn, "idempotency: the claim waited past lock_timeout behind a table lock (DDL, a migration)"}
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
	rq.m.log.Log(rq.r.Context(), level, msg, "endpoint", rq.label, "scope", rq.claim.Scope, "key", rq.claim.Key,
		"operation", storeOp(err), "reason", reason, "error", err)
}

// passThrough runs the handler with no idempotency tracking. A
// transactional route still gets its transaction, so the handler has one
// shape.
func (rq *request) passThrough() {
	if rq.rt.txStore == nil {
		rq.rt.next.ServeHTTP(rq.w, rq.r)
		return
	}
	rq.name()
	rq.run(nil, time.Time{}, nil)
}
