package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The Do adapter: an Operation's calls through the engine. A call is
// admitted from a Call (the opaque-key rules, the scope), and Exec's
// function is the handler; do_result.go encodes Do's values into the
// Response the engine records.

// Operation is a named entry point other than an HTTP route: a queue
// consumer, a webhook, a job. Build one with Middleware.Operation and run
// its calls with Do. It is safe for concurrent use.
type Operation struct {
	m        *Middleware
	p        policy
	endpoint string // do:<name>, or the adapter's own (grpc:/pkg.Service/Method)
	adapter  string // the endpoint's scheme: do, grpc, connect
	minKey   int    // RouteConfig.MinKeyLength
	codec    Codec  // nil: encoding/json
	scoped   bool   // RouteConfig.Scoped: a call without a scope is refused
	follow   bool   // the kill-switch applies: FollowKillSwitch, or a gRPC/Connect adapter
}

// Call is one call of an Operation.
type Call struct {
	// Key is the call's idempotency key (a message's id, a webhook's event id): 1
	// to 255 visible ASCII characters or spaces, compared exactly, at least
	// RouteConfig.MinKeyLength.
	Key string
	// Scope is the user the call is about ("" asks Config.Scope): keys of
	// different scopes never meet, and erasure finds a user's rows by it. On a
	// Scoped Operation a call whose scope is still empty is refused
	// (ErrInvalidScope).
	Scope   string
	Request []byte // hashed as an HTTP body is: the key sent with other bytes is ErrMismatch
}

// CallInfo tells how Do answered a call.
type CallInfo struct {
	Replayed bool      // the first run's result, replayed: the function did not run
	Bypassed bool      // the function ran without deduplication (the kill-switch it follows, or a fail-open store outage)
	Expires  time.Time // the key's expires_at, to the second, when the call read or wrote its row; else zero
}

// Codec encodes the results of Do for the store (RouteConfig.Codec):
// Unmarshal must restore what Marshal wrote into the value v points to.
type Codec interface {
	Marshal(v any) ([]byte, error)      // the bytes stored for the result v
	Unmarshal(data []byte, v any) error // restores into *v what Marshal wrote
}

// doScheme is the scheme of Do's endpoints: do:<name>.
const doScheme = "do"

// Operation returns the entry point name under policy rc, for Do, keyed
// under the endpoint do:<name> (a scheme:/path name as it is). Keys are
// opaque; rc's HTTP-only fields must be unset, and rc Scoped or with a
// MinKeyLength of at least 16. The kill-switch applies to grpc: and
// connect: names always, to others only with rc.FollowKillSwitch.
func (m *Middleware) Operation(name string, rc RouteConfig) (*Operation, error) {
	endpoint, adapter := doScheme+":"+name, doScheme
	if scheme, _, ok := strings.Cut(name, ":/"); ok && isScheme(scheme) {
		endpoint, adapter = name, scheme
	}
	switch {
	case name == "" || !storable(endpoint):
		return nil, errors.New("idempotency: an Operation's name must be UTF-8 without NUL bytes, its endpoint (do:<name>) 1 to 1024 bytes")
	case adapter == "http" || adapter == "https":
		return nil, errors.New("idempotency: an Operation's name may not name the http adapter")
	case rc.Name != "" || rc.KeyFormat != KeyUUID && rc.KeyFormat != KeyOpaque || rc.ParseKey != nil || rc.RequireKey ||
		rc.MaxBodyBytes != 0 || rc.ReplayHeaders != nil || rc.NoReplayMarker:
		return nil, errors.New("idempotency: an Operation takes no RouteConfig.Name, ParseKey, RequireKey, MaxBodyBytes, ReplayHeaders or NoReplayMarker, and a valid KeyFormat")
	case rc.MinKeyLength < 0 || rc.MinKeyLength > MaxKeyLength:
		return nil, errors.New("idempotency: RouteConfig.MinKeyLength must be between 0 and 255")
	case !rc.Scoped && rc.MinKeyLength < minGuardKeyLength:
		return nil, fmt.Errorf("idempotency: %s: set RouteConfig.Scoped (every call carries a scope) or RouteConfig.MinKeyLength of at least %d (UUID keys meet it): "+
			"a short unscoped key of one client would be answered with another client's record", endpoint, minGuardKeyLength)
	case rc.Scoped && adapter != doScheme && !m.scoped:
		return nil, fmt.Errorf("idempotency: %s: RouteConfig.Scoped needs Config.Scope, the only scope of an adapter's calls", endpoint)
	}
	p, err := m.newPolicy(rc.withDefaults())
	if err != nil {
		return nil, err
	}
	return &Operation{m: m, p: p, endpoint: endpoint, adapter: adapter, minKey: rc.MinKeyLength, codec: rc.Codec,
		scoped: rc.Scoped, follow: rc.FollowKillSwitch || adapter == "grpc" || adapter == "connect"}, nil
}

// isScheme reports whether s is an adapter's scheme: lower-case letters.
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return s != ""
}

// reservedName reports an HTTP route name that could be an Operation's
// endpoint, which one adapter would then replay to the other.
func reservedName(name string) bool {
	scheme, _, ok := strings.Cut(name, ":/")
	return strings.HasPrefix(name, doScheme+":") || ok && isScheme(scheme)
}

// Exec is Do for other transports' adapters (contrib/grpc): fn's Response
// is recorded as it is, its Status deciding the outcome as over HTTP unless
// its Header's ":outcome" ("complete", "fail", "release", "unsettled")
// does; headers named ':...' are not stored. A replay returns the stored
// Response.
func (op *Operation) Exec(ctx context.Context, c Call, fn func(context.Context) Response) (Response, CallInfo, error) {
	oc := &opCall{op: op, fn: fn}
	oc.request = request{policy: &op.p, m: op.m, ctx: ctx, t: oc, adapter: op.adapter, start: op.m.startClock(),
		endpoint: op.endpoint, label: op.endpoint}
	if oc.admit(c) {
		oc.serve()
	}
	return oc.out, oc.info, oc.err
}

// opCall is one call of an Operation on its way: the engine's call, and
// the adapter's side of it, which runs fn and keeps what is delivered.
type opCall struct {
	request
	op    *Operation
	fn    func(context.Context) Response
	res   Response // fn's result
	limit int64    // how much of res.Body is recorded (0: all)
	held  bool     // a transactional run: res waits for the commit
	out   Response // delivered: fn's result, or the stored one
	info  CallInfo
	err   error // delivered: an answer instead
}

// admit checks the call's key and scope and builds its claim; with the
// kill-switch off, on an Operation that follows it, it runs fn at once.
func (oc *opCall) admit(c Call) bool {
	if oc.op.follow && !oc.m.cfg.Enabled(oc.ctx) {
		oc.info.Bypassed = true
		oc.switchedOff()
		return false
	}
	if c.Key == "" {
		oc.answer(answerMissingKey)
		return false
	}
	if !validCallKey(c.Key, oc.op.minKey) {
		oc.answer(answerInvalidOpaqueKey)
		return false
	}
	scope := c.Scope
	if scope == "" && oc.m.scoped {
		scope = oc.m.cfg.Scope(oc.ctx)
	}
	// The endpoint in place of method and path.
	return oc.admitClaim(c.Key, scope, requestHash(oc.endpoint, "", "", c.Request), oc.op.scoped)
}

// validCallKey applies the opaque-key rules to a Call's key, exactly as
// given: 1 to MaxKeyLength bytes from space to '~', and at least min.
func validCallKey(key string, min int) bool {
	if len(key) == 0 || len(key) > MaxKeyLength || len(key) < min {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < ' ' || key[i] > '~' {
			return false
		}
	}
	return true
}

// pass runs fn with no claim.
func (oc *opCall) pass(keyed bool) {
	ctx := oc.ctx
	if keyed {
		ctx = oc.withKey(ctx, oc.bypassRecord())
	}
	oc.info.Bypassed = true
	oc.out = oc.fn(ctx)
}

func (oc *opCall) handle(ctx context.Context, limit int64, held bool) {
	oc.limit, oc.held = limit, held
	oc.res = oc.fn(ctx)
	if named := oc.res.Header[outcomeHeader]; len(named) == 1 && named[0] == outcomeUnsettled {
		markUnsettled(ctx)
	}
}

// outcomeUnsettled is the ":outcome" of a result whose function ended
// Unsettled (ErrUnsettled; an RPC adapter's IDEMPOTENCY_UNSETTLED).
const outcomeUnsettled = "unsettled"

// status is the status whose class decides the outcome: fn's, or one of
// the class its ":outcome" names.
func (oc *opCall) status() int {
	status := cmp.Or(oc.res.Status, 200)
	switch named := oc.res.Header[outcomeHeader]; {
	case len(named) != 1:
	case named[0] == "complete" && (status >= 500 || status == statusTooManyRequests):
		return 200
	case named[0] == "fail" && status < 500:
		return 500
	case named[0] == "release":
		return statusTooManyRequests
	}
	return status
}

// outcomeHeader is the reserved name under which an Exec result names its
// outcome.
const outcomeHeader = ":outcome"

// tooLarge reports a transactional result over the cap an HTTP route's
// buffer has, so every adapter answers it alike (rolled back, 500).
func (oc *opCall) tooLarge() bool {
	return oc.held && oc.limit > 0 && int64(len(oc.res.Body)) > bufferCap(oc.limit)
}

// result is fn's result as recorded: without its body when that is over
// the limit.
func (oc *opCall) result() Response {
	r := oc.res
	r.Status = cmp.Or(r.Status, 200)
	if _, ok := r.Header[outcomeHeader]; ok {
		r.Header = r.Header.Clone()
		delete(r.Header, outcomeHeader)
	}
	if oc.limit > 0 && int64(len(r.Body)) > oc.limit {
		r.Body, r.BodyKind = nil, BodyNone
	}
	return r
}

func (oc *opCall) send() {
	oc.out, oc.out.Status, oc.info.Expires = oc.res, cmp.Or(oc.res.Status, 200), advertise(oc.expires)
}

func (oc *opCall) replay(resp Response) {
	oc.out, oc.info.Replayed, oc.info.Expires = resp, true, advertise(oc.expires)
}

func (oc *opCall) auditContext() context.Context { return oc.ctx }

// reconciled is a Reconcile hook's done value as the Operation records it.
func (oc *opCall) reconciled(v any) (Response, error) {
	codec, kind := oc.op.codecOf()
	return reconciledValue(v, codec, kind)
}

// deliver keeps answer a as the call's error.
func (oc *opCall) deliver(a answer, original int) {
	e := oc.m.errorAnswer(a, original)
	e.err, e.Expires = answers[a].err, oc.advertised(a)
	oc.info.Expires = e.Expires
	if a == answerUnavailable && oc.cause != nil {
		e.err = oc.cause
		if !errors.Is(oc.cause, ErrStoreUnavailable) {
			e.err = errors.Join(ErrStoreUnavailable, oc.cause)
		}
	}
	oc.err = &e
}
