package idempotency

// The engine: a call's way (admit -> claim -> execute -> record | answer),
// written against a transport rather than net/http. Each entry point is an
// adapter that admits its calls into a request (the HTTP route:
// http_route.go; Do: do.go) and implements transport, so the claim, the
// execution, the record and the contract's answers are written once.

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// request is one call on its way through the engine: what is known of it
// so far, computed once and handed from step to step. An adapter fills in
// its admission (the endpoint, the label, the claim) and then calls serve,
// or passThrough for a call with no key.
type request struct {
	policy *policy // the entry point's policy (a route's, or an Operation's)
	m      *Middleware
	ctx    context.Context // the call's: logs, the Observer, store calls (detached)
	t      transport       // the adapter's side of the call
	// adapter names the entry point: "http", "do", or an Operation's scheme.
	adapter string
	// Set by the adapter, once a step needs them:
	endpoint string // the key's scope_endpoint
	label    string // the metrics label: a route name or pattern, never a raw path
	// Set by the adapter's admission, for a keyed call:
	claim ClaimRequest  // key, scope, endpoint, request hash, TTL, lease, owner token
	rm    *routeMetrics // the label's counters
	// Set by claimKey:
	claimStart time.Time // when the first claiming call began: the earliest the lease can have started
	// cause is why the store was unavailable, for the answer that says so.
	cause error
	// For Config.Observer:
	start        time.Time     // when the call reached the engine (only with an Observer)
	storeTime    time.Duration // time spent in store calls
	recordFailed bool          // an outcome could not be settled
	hit, miss    bool          // counted in idempotency_hit_total or idempotency_miss_total
	storeReason  string        // the reason of the store error the claim failed with
	observed     bool          // the decision was reported
	reconciled   bool          // the key was reconciled once (reconcile.go)
	// run is the call's execution, if it runs one: kept here, where the adapter
	// already allocated the call, rather than allocated apart.
	run0 execution
}

// transport is an adapter's side of a call: how it runs its handler (an
// HTTP handler, Do's function) and delivers what the engine decided, in
// its own terms (a response written; a value or an error returned). The
// engine calls it from the call's goroutine, and delivers exactly once:
// send, deliver or replay, or through pass.
type transport interface {
	// pass runs the handler with no claim (a pass-through, a bypass), with
	// the key (and Derivation) of rec in its context when keyed, and
	// delivers its result.
	pass(keyed bool)
	// handle runs the handler under ctx and holds its result: for the record up to
	// limit bytes when limit > 0, and whole until the commit when held (a
	// transactional run). It may panic: the handler's panic.
	handle(ctx context.Context, limit int64, held bool)
	// status is the held result's status: HTTP's, or the adapter's HTTP-like code
	// (200 for a handler that said nothing).
	status() int
	// tooLarge reports a held result that outgrew the transactional cap.
	tooLarge() bool
	// result is the held result as recorded: status, replayable metadata and body.
	result() Response
	// send delivers the handler's own result.
	send()
	// deliver delivers one of the contract's answers instead (original: the stored
	// status of answerNotStored), undoing what the handler set.
	deliver(a answer, original int)
	// replay delivers a stored result.
	replay(resp Response)
	// auditContext is the context Config.OnReplay gets.
	auditContext() context.Context
	// reconciled is a Reconcile hook's done value as the adapter records it.
	reconciled(v any) (Response, error)
}

// startClock notes a call's arrival, when an Observer will want its
// duration.
func (m *Middleware) startClock() time.Time {
	if m.cfg.Observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// withKey returns ctx carrying a call's key (KeyFromContext) and, from
// rec, its Derivation, for a handler that runs under it.
func (rq *request) withKey(ctx context.Context, rec Record) context.Context {
	return withDerivation(context.WithValue(ctx, keyCtxKey, rec.Key), rq.m.cfg.DeriveKeys, rec)
}

// bypassRecord is the call's own claim as a Record, for a handler that
// runs with its key but no row (a fail-open bypass).
func (rq *request) bypassRecord() Record {
	c := &rq.claim
	return Record{Key: c.Key, Scope: c.Scope, Endpoint: c.Endpoint, DeriveKeyID: c.DeriveKeyID}
}

// maxScopeBytes bounds a key's user scope and its endpoint, so that (key,
// scope, endpoint) always fits the store's unique index (a btree entry
// holds about 2.7 kB).
const maxScopeBytes = 1024

// storable reports whether s can be stored as a scope or endpoint: valid
// UTF-8 without NUL bytes (Postgres TEXT refuses both), at most
// maxScopeBytes.
func storable(s string) bool {
	return len(s) <= maxScopeBytes && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// admitClaim builds the claim of a keyed call, the one admission every
// adapter ends with, or refuses (400 idempotency_scope_invalid) a scope or
// endpoint the store could not hold and an empty scope where the scope
// guards the keys: such a value would fail every claim of the key alike,
// and must not count as an outage (which a fail-open route would run
// without deduplication, every time).
func (rq *request) admitClaim(key, scope, hash string, needScope bool) bool {
	if !storable(scope) || !storable(rq.endpoint) || scope == "" && needScope {
		rq.m.log.WarnContext(rq.ctx, "idempotency: scope or endpoint cannot be stored (not UTF-8, a NUL byte, or too long), or the scope that guards the keys is empty",
			"endpoint", rq.label, "scope_bytes", len(scope), "endpoint_bytes", len(rq.endpoint))
		rq.answer(answerInvalidScope)
		return false
	}
	rq.claim = ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    rq.endpoint,
		RequestHash: hash,
		TTL:         rq.policy.ttl,
		Lease:       rq.m.cfg.Lease,
		LockWait:    rq.policy.txLockWait,
		Owner:       uuid.New(), // one per call: the store's retry of this claim knows its own row
		DeriveKeyID: rq.activeDeriveKeyID(),
	}
	rq.rm = rq.m.metricsFor(rq.label)
	return true
}
