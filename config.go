package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults, limits and policies of Config and RouteConfig.
const (
	ExpiredRunAgain ExpiredPolicy = 0 // a key past its TTL is new again: the call runs
	ExpiredRefuse   ExpiredPolicy = 1 // a tombstone until TTL + Grace: 422 idempotency_key_expired

	DefaultLease            = 30 * time.Second
	DefaultStoreTimeout     = 2 * time.Second
	DefaultBodyTimeout      = 10 * time.Second
	DefaultTTL              = 24 * time.Hour
	MaxTTL                  = 30 * 24 * time.Hour
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	minTTL                  = time.Minute
)

// DefaultTxLockWait is RouteConfig.TxLockWait's default: a duplicate waits
// this long for an owner mid-handler to commit before it answers 409.
const DefaultTxLockWait = 10 * time.Millisecond

// DefaultProblemTypeBase is where the problem+json type URIs point by
// default: README's list of the contract's error codes.
const DefaultProblemTypeBase = "https://github.com/idemkit/idempotency/blob/main/README.md#"

// ExpiredPolicy is what a key past its TTL gets (RouteConfig.Expired).
type ExpiredPolicy int

// Config configures a Middleware. The zero value is usable: every field has
// a default.
type Config struct {
	// Lease is how long a claim owns its key; a handler gets Lease minus
	// StoreTimeout to run (MaxRun with RouteConfig.Heartbeat), so its outcome is
	// recorded within the lease. Must exceed StoreTimeout. Defaults to 30s.
	Lease        time.Duration
	StoreTimeout time.Duration // bounds every store call; a store that does not answer in time is unavailable. Defaults to 2s.
	BodyTimeout  time.Duration // bounds reading a keyed request's body (else 400 idempotency_body_unreadable, Connection: close). Defaults to 10s.
	// Scope returns the call's user scope from its context (an HTTP request is
	// RequestFromContext's); keys of different scopes never meet; "" is
	// unscoped. A scope the store cannot hold (not UTF-8, NUL, over 1024 bytes)
	// is a 400 idempotency_scope_invalid. Defaults to a function returning "".
	Scope func(ctx context.Context) string
	// RouteName, when set, names an HTTP route whose RouteConfig.Name is empty,
	// before r.Pattern: the route's template, never the raw path (a metrics
	// label and scope_endpoint); "" falls through. Defaults to nil.
	RouteName func(ctx context.Context) string
	// Enabled is the kill-switch, asked on every call: false makes every HTTP
	// route, gRPC method and Connect procedure a pass-through (an Operation
	// only with FollowKillSwitch). Defaults to EnabledFromEnv.
	Enabled func(ctx context.Context) bool
	// OnReplay, when set, is called before every replay with the call's
	// context, detached and bounded by StoreTimeout. An error refuses the replay
	// on a fail-closed route (503; the client retries the key); a fail-open
	// route replays anyway, with a WARN. Defaults to nil.
	OnReplay func(context.Context, ReplayEvent) error
	// Logger receives WARN and ERROR events, each with the call's context; bodies
	// are never logged. Defaults to slog.Default().
	Logger *slog.Logger
	// OmitIdentifiers leaves keys and user scopes out of logs and Observations.
	// Defaults to false.
	OmitIdentifiers bool
	// IdentifierSecret, when set (16 bytes or more), logs keys and scopes as
	// their HMAC-SHA256 under it ("key_hmac", "scope_hmac"), as Observers get
	// the scope. Defaults to nil.
	IdentifierSecret []byte
	// Observer, when set, is called once per decided call with an Observation;
	// it must be fast and not write the response (contrib/otel has one).
	// Defaults to nil.
	Observer func(ctx context.Context, o Observation)
	// ErrorFormat is the body form of the contract's HTTP error answers: ErrorJSON
	// or ErrorProblem. Defaults to ErrorJSON.
	ErrorFormat ErrorFormat
	// ProblemTypeBase prefixes each problem+json "type" URI, which ends with the
	// answer's idempotency_... code: an absolute URI of printable ASCII ending in
	// '/', '#' or ':'. Defaults to DefaultProblemTypeBase.
	ProblemTypeBase string
	// ErrorWriter, when set, writes every HTTP error answer (Content-Type,
	// e.Status, a body keeping e.Code) instead of ErrorFormat's; Retry-After and
	// Connection: close are set. Defaults to nil.
	ErrorWriter func(w http.ResponseWriter, r *http.Request, e ErrorAnswer)
	// Registerer receives the metrics. Defaults to nil: counted, registered
	// nowhere (never the global registry).
	Registerer prometheus.Registerer
	// DeriveKeys keys package downstream's ids. Defaults to nil (refused).
	DeriveKeys DeriveKeys
}

// RouteConfig is one route's or Operation's policy. The zero value is a
// fail-closed route with the defaults below.
type RouteConfig struct {
	// Name is the key's scope_endpoint and the metrics label, at most 1024
	// bytes of UTF-8. Defaults to Config.RouteName's answer, then r.Pattern,
	// then the method and path (label "unnamed").
	Name string
	// KeyFormat is the form of Idempotency-Key the route accepts (a refused key
	// is a 400). An opaque route needs Config.Scope or a MinKeyLength of at
	// least 16. Defaults to KeyUUID.
	KeyFormat KeyFormat
	// MinKeyLength is the shortest key, in bytes, an opaque route (KeyOpaque or
	// ParseKey) or an Operation accepts. Defaults to 0 (1 byte).
	MinKeyLength int
	// ParseKey, when set, parses the route's Idempotency-Key header values instead
	// of KeyFormat: the key to store (1 to 255 bytes of UTF-8 without NUL, at
	// least MinKeyLength), or an error for a 400. The route is an opaque route.
	// Defaults to nil.
	ParseKey func(value string) (string, error)
	// FailOpen runs the handler without deduplication when the store is
	// unavailable (billing, account mutations). Defaults to false: the route fails
	// closed with 503 and the handler does not run (orders).
	FailOpen bool
	// TTL is how long a key is remembered: at most 30 days, at least the larger of
	// 1 minute and twice the lease; Grace, how long ExpiredRefuse keeps it after as a tombstone (at most 30 days). Defaults to 24h and TTL.
	TTL, Grace time.Duration
	// Expired is what a key past its TTL gets. Defaults to ExpiredRunAgain.
	Expired ExpiredPolicy
	// RequireKey answers 400 to requests without an Idempotency-Key. Defaults to
	// false: such requests pass through.
	RequireKey bool
	// MaxBodyBytes limits a keyed request's body, held in memory while it is
	// hashed; larger bodies get 413. math.MaxInt64 means no limit but memory.
	// Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes limits the recorded response body (or Do's value); a
	// larger one is sent but not recorded, and duplicates get 409
	// idempotency_response_not_stored. Defaults to 1 MiB.
	MaxResponseBytes int64
	// ReplayHeaders are response headers replayed besides Content-Type,
	// Content-Encoding, Location and Content-Language. Set-Cookie, Authorization,
	// WWW-Authenticate, Proxy-*, hop-by-hop headers, Date and Content-Length are
	// refused. Defaults to none.
	ReplayHeaders []string
	// NoReplayMarker replays a JSON object without the added
	// "idempotency_replayed" member (the header stays). Defaults to false.
	NoReplayMarker bool
	// NoStore never records response bodies (personal data): concurrent
	// duplicates get 409 in flight and a completed key is released, so a later
	// retry executes again. Defaults to false.
	NoStore bool
	// Transactional claims the key inside a database transaction the handler
	// writes through (TxFromContext), committed with the record. Needs a
	// TxStore and a fail-closed route. Defaults to false.
	Transactional bool
	// TxLockWait bounds how long a transactional claim waits on another open
	// transaction holding the key before answering 409 in flight; the store's
	// TxLockWaitBudget of it must stay below Config.StoreTimeout. Defaults to
	// DefaultTxLockWait.
	TxLockWait time.Duration
	// ReleaseOnError releases a transactional route's key when the handler
	// fails (>= 500, panic), its writes rolled back. Defaults to false.
	ReleaseOnError bool
	Heartbeat      bool          // renew the lease while the handler runs, cancelled if it is lost (503); not Transactional. Defaults to false.
	MaxRun         time.Duration // required with Heartbeat: the handler's deadline after its claim, above the lease, at most TTL/2
	// Codec, on an Operation, encodes the values Do stores. Defaults to
	// encoding/json.
	Codec Codec
	// Scoped declares that every call carries a user scope (Call.Scope, or
	// Config.Scope's answer): a call with an empty one is refused before any
	// store call (ErrInvalidScope). An Operation, gRPC method or Connect
	// procedure that is not Scoped needs a MinKeyLength of at least 16.
	// Defaults to false.
	Scoped bool
	// FollowKillSwitch makes an Operation's Do follow Config.Enabled: while
	// off, Do runs the function without a store call (CallInfo.Bypassed).
	// Defaults to false.
	FollowKillSwitch bool
	// Reconcile, when set, settles a key found in flight past its lease (docs/reconcile.md): a value is done, ErrNotDone runs the handler, an error is unknown.
	Reconcile        func(ctx context.Context, info ReconcileInfo) (any, error)
	ReconcileTimeout time.Duration // bounds Reconcile, below Config.Lease less StoreTimeout; defaults to StoreTimeout
	WaitInFlight     time.Duration // how long a duplicate of a key in flight waits for its answer before 409; below Lease, not Transactional or NoStore. Defaults to 0.
}

// withDefaults returns cfg with every unset field at its default.
func (c Config) withDefaults() Config {
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.BodyTimeout = cmp.Or(c.BodyTimeout, DefaultBodyTimeout)
	if c.Scope == nil {
		c.Scope = func(context.Context) string { return "" }
	}
	if c.Enabled == nil {
		c.Enabled = EnabledFromEnv
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.ProblemTypeBase = cmp.Or(c.ProblemTypeBase, DefaultProblemTypeBase)
	return c
}

func (c *Config) validate() error {
	switch {
	case c.Lease < 0:
		return fmt.Errorf("idempotency: Config.Lease must be positive, got %v", c.Lease)
	case c.StoreTimeout < 0:
		return fmt.Errorf("idempotency: Config.StoreTimeout must be positive, got %v", c.StoreTimeout)
	case c.BodyTimeout < 0:
		return fmt.Errorf("idempotency: Config.BodyTimeout must be positive, got %v", c.BodyTimeout)
	case c.Lease <= c.StoreTimeout:
		return fmt.Errorf("idempotency: Config.Lease (%v) must exceed Config.StoreTimeout (%v)", c.Lease, c.StoreTimeout)
	case c.OmitIdentifiers && len(c.IdentifierSecret) > 0:
		return errors.New("idempotency: Config.OmitIdentifiers and Config.IdentifierSecret exclude each other")
	case len(c.IdentifierSecret) > 0 && len(c.IdentifierSecret) < 16:
		return fmt.Errorf("idempotency: Config.IdentifierSecret must be at least 16 bytes, got %d", len(c.IdentifierSecret))
	case c.ErrorFormat != ErrorJSON && c.ErrorFormat != ErrorProblem:
		return fmt.Errorf("idempotency: Config.ErrorFormat %d is neither ErrorJSON nor ErrorProblem", c.ErrorFormat)
	case !validTypeBase(c.ProblemTypeBase):
		return fmt.Errorf("idempotency: Config.ProblemTypeBase %q must be an absolute URI of printable ASCII ending in '/', '#' or ':'", c.ProblemTypeBase)
	}
	return nil
}

// validTypeBase reports whether base can prefix a problem type URI that
// ends with an answer's code: absolute, printable ASCII (so it is the same
// text in JSON) and ending where a URI segment ends.
func validTypeBase(base string) bool {
	for i := 0; i < len(base); i++ {
		if base[i] <= ' ' || base[i] >= 0x7f || base[i] == '"' || base[i] == '\\' {
			return false
		}
	}
	u, err := url.Parse(base)
	return err == nil && u.IsAbs() && strings.ContainsAny(base[len(base)-1:], "/#:")
}

// withDefaults returns rc with every unset field at its default.
func (rc RouteConfig) withDefaults() RouteConfig {
	rc.TTL = cmp.Or(rc.TTL, DefaultTTL)
	if rc.Expired == ExpiredRefuse {
		rc.Grace = cmp.Or(rc.Grace, rc.TTL)
	}
	rc.MaxBodyBytes = min(cmp.Or(rc.MaxBodyBytes, DefaultMaxBodyBytes), math.MaxInt64-1)
	rc.MaxResponseBytes = cmp.Or(rc.MaxResponseBytes, DefaultMaxResponseBytes)
	rc.TxLockWait = cmp.Or(rc.TxLockWait, DefaultTxLockWait)
	return rc
}

// validate checks a route's policy, defaults filled, under a middleware
// of store s whose lease is lease and whose store calls are bounded by
// storeTimeout.
func (rc *RouteConfig) validate(lease, storeTimeout time.Duration, s Store) error {
	budget := func(time.Duration) time.Duration { return 0 }
	if ts, ok := s.(TxStore); ok {
		budget = ts.TxLockWaitBudget
	}
	floor := max(minTTL, 2*lease)
	switch {
	case !storable(rc.Name):
		return fmt.Errorf("idempotency: RouteConfig.Name must be valid UTF-8, without NUL bytes, at most %d bytes", maxScopeBytes)
	case rc.TTL > MaxTTL:
		return fmt.Errorf("idempotency: RouteConfig.TTL (%v) exceeds the maximum of %v", rc.TTL, MaxTTL)
	case rc.TTL < floor:
		return fmt.Errorf("idempotency: RouteConfig.TTL (%v) is below the minimum of %v (the larger of 1m and twice the lease)", rc.TTL, floor)
	case rc.Expired != ExpiredRunAgain && rc.Expired != ExpiredRefuse:
		return fmt.Errorf("idempotency: RouteConfig.Expired %d is neither ExpiredRunAgain nor ExpiredRefuse", rc.Expired)
	case rc.Grace != 0 && rc.Expired != ExpiredRefuse:
		return errors.New("idempotency: RouteConfig.Grace applies to ExpiredRefuse only")
	case rc.Grace < 0 || rc.Grace > MaxTTL:
		return fmt.Errorf("idempotency: RouteConfig.Grace (%v) must be positive and at most %v", rc.Grace, MaxTTL)
	case rc.MaxBodyBytes < 0:
		return fmt.Errorf("idempotency: RouteConfig.MaxBodyBytes must be positive, got %d", rc.MaxBodyBytes)
	case rc.MaxResponseBytes < 0:
		return fmt.Errorf("idempotency: RouteConfig.MaxResponseBytes must be positive, got %d", rc.MaxResponseBytes)
	case rc.TxLockWait < time.Millisecond:
		return fmt.Errorf("idempotency: RouteConfig.TxLockWait must be at least 1ms, got %v", rc.TxLockWait)
	case rc.Transactional && budget(rc.TxLockWait) >= storeTimeout:
		// Each of the claim's tries may wait the bound out once, all in one
		// store call: past the store timeout, a duplicate of a key in flight
		// gets 503 instead of 409.
		return fmt.Errorf("idempotency: RouteConfig.TxLockWait (%v): the claim's lock waits may take %v on this store, which must be below Config.StoreTimeout (%v)",
			rc.TxLockWait, budget(rc.TxLockWait), storeTimeout)
	case rc.ReleaseOnError && !rc.Transactional:
		return errors.New("idempotency: RouteConfig.ReleaseOnError needs RouteConfig.Transactional")
	case rc.Transactional && rc.FailOpen:
		return errors.New("idempotency: RouteConfig.Transactional requires a fail-closed route (FailOpen false)")
	case rc.Transactional && rc.NoStore:
		return errors.New("idempotency: RouteConfig.Transactional cannot be combined with NoStore")
	}
	if err := rc.validateReconcile(lease, storeTimeout); err != nil {
		return err
	}
	if err := rc.validateWait(lease); err != nil {
		return err
	}
	return rc.validateHeartbeat(lease)
}

// validateWait checks WaitInFlight: a wait must end inside the owner's
// lease, and needs an answer to wait for. A transactional owner's row is
// invisible until it commits (its duplicates wait on the row lock,
// TxLockWait); a NoStore key is released, not answered.
func (rc *RouteConfig) validateWait(lease time.Duration) error {
	switch {
	case rc.WaitInFlight < 0:
		return fmt.Errorf("idempotency: RouteConfig.WaitInFlight must not be negative, got %v", rc.WaitInFlight)
	case rc.WaitInFlight == 0:
	case rc.WaitInFlight >= lease:
		return fmt.Errorf("idempotency: RouteConfig.WaitInFlight (%v) must be below Config.Lease (%v)", rc.WaitInFlight, lease)
	case rc.Transactional:
		return errors.New("idempotency: RouteConfig.WaitInFlight does not apply to Transactional routes (their duplicates wait TxLockWait on the row)")
	case rc.NoStore:
		return errors.New("idempotency: RouteConfig.WaitInFlight cannot be combined with NoStore: no answer is stored to wait for")
	}
	return nil
}

// validateHeartbeat checks Heartbeat and MaxRun: a handler may run past
// its lease only where the lease can be renewed (not in a transaction,
// whose claim commits only with the record), and must record before the
// key expires (MaxRun at most TTL/2).
func (rc *RouteConfig) validateHeartbeat(lease time.Duration) error {
	switch {
	case !rc.Heartbeat && rc.MaxRun != 0:
		return errors.New("idempotency: RouteConfig.MaxRun needs RouteConfig.Heartbeat")
	case !rc.Heartbeat:
		return nil
	case rc.Transactional:
		return errors.New("idempotency: RouteConfig.Heartbeat cannot be combined with Transactional: a transaction's claim cannot be renewed")
	case rc.MaxRun == 0:
		return errors.New("idempotency: RouteConfig.Heartbeat needs RouteConfig.MaxRun")
	case rc.MaxRun <= lease:
		return fmt.Errorf("idempotency: RouteConfig.MaxRun (%v) must exceed Config.Lease (%v)", rc.MaxRun, lease)
	case rc.MaxRun > rc.TTL/2:
		return fmt.Errorf("idempotency: RouteConfig.MaxRun (%v) must be at most half of RouteConfig.TTL (%v), so the record lands before the key expires", rc.MaxRun, rc.TTL)
	}
	return nil
}

// txStore returns the TxStore a transactional route needs, nil for any
// other route.
func (rc *RouteConfig) txStore(s Store) (TxStore, error) {
	if !rc.Transactional {
		return nil, nil
	}
	ts, ok := s.(TxStore)
	if !ok {
		return nil, errors.New("idempotency: RouteConfig.Transactional needs a store that implements TxStore, such as *PostgresStore")
	}
	return ts, nil
}
