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

// Defaults and limits of Config and RouteConfig.
const (
	DefaultLease            = 30 * time.Second
	DefaultStoreTimeout     = 2 * time.Second
	DefaultBodyTimeout      = 10 * time.Second
	DefaultTTL              = 24 * time.Hour
	MaxTTL                  = 7 * 24 * time.Hour
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

// Config configures a Middleware. The zero value is usable: every field has
// a default.
type Config struct {
	// Lease is how long a claim owns its key. A handler gets Lease minus
	// StoreTimeout to run, so its outcome can always be recorded within the
	// lease; an in_flight key whose lease is over is stale. Must exceed
	// StoreTimeout. Defaults to 30s.
	Lease time.Duration
	// StoreTimeout bounds every store call; a store that does not answer in
	// time is unavailable. Defaults to 2s.
	StoreTimeout time.Duration
	// BodyTimeout bounds reading a keyed request's body, where the
	// connection supports read deadlines: a body not read whole in time is
	// a 400 idempotency_body_unreadable with Connection: close, and nothing
	// more of it is read. Defaults to 10s.
	BodyTimeout time.Duration
	// Scope returns the user scope of a call from its context (an HTTP
	// route's request is RequestFromContext's): keys of different scopes
	// never meet; "" is unscoped. Run the middleware after the session
	// middleware. Do asks it only for a Call without a Scope. A scope the
	// store cannot hold (not UTF-8, a NUL byte, over 1024 bytes) is a 400
	// idempotency_scope_invalid (ErrInvalidScope) before any claim.
	// Defaults to a function returning "".
	Scope func(ctx context.Context) string
	// RouteName, when set, names an HTTP route (RequestFromContext) whose
	// RouteConfig.Name is empty, before r.Pattern, for routers that do not
	// set r.Pattern; the contrib modules provide one per framework. It must
	// return the route's template ("POST /accounts/{id}/orders"), never the
	// raw path: the name is a metrics label and the key's scope_endpoint.
	// "" falls through to r.Pattern. Defaults to nil.
	RouteName func(ctx context.Context) string
	// Enabled is the kill-switch for endpoints, asked on every call with its
	// context: false makes every HTTP route, gRPC method and Connect
	// procedure a pure pass-through. An Operation run by Do keeps
	// deduplicating whatever it says (a consumer that passed through would
	// charge again on every redelivery), unless its RouteConfig sets
	// FollowKillSwitch. Defaults to EnabledFromEnv.
	Enabled func(ctx context.Context) bool
	// OnReplay, when set, is called synchronously before every replay, so
	// the host can write its own audit row, with the call's context
	// (RequestFromContext on HTTP) detached from the client and bounded by
	// StoreTimeout. An error refuses the replay on a fail-closed route (503
	// idempotency_store_unavailable; the client retries the same key); a
	// fail-open route replays anyway, with a WARN log. Defaults to nil.
	OnReplay func(context.Context, ReplayEvent) error
	// Logger receives WARN and ERROR events, each with the call's context;
	// bodies are never logged. Defaults to slog.Default().
	Logger *slog.Logger
	// OmitIdentifiers leaves keys and user scopes out of logs and
	// Observations. Defaults to false.
	OmitIdentifiers bool
	// IdentifierSecret, when set, logs keys and scopes as "key_hmac" and
	// "scope_hmac", their HMAC-SHA256 (hex) under this secret, and gives
	// Observers the scope's HMAC: records still correlate, but no reader
	// without the secret recovers a user. At least 16 bytes. Defaults to nil.
	IdentifierSecret []byte
	// Observer, when set, is called synchronously once per decided call
	// with its context and an Observation. It must be fast and must not
	// write to the response; contrib/otel provides one for OpenTelemetry.
	// Defaults to nil.
	Observer func(ctx context.Context, o Observation)
	// ErrorFormat is the body form of the contract's HTTP error answers:
	// ErrorJSON or ErrorProblem. Defaults to ErrorJSON.
	ErrorFormat ErrorFormat
	// ProblemTypeBase prefixes each problem+json "type" URI, which ends with
	// the answer's idempotency_... code: an absolute URI of printable ASCII
	// ending in '/', '#' or ':'. Defaults to DefaultProblemTypeBase.
	ProblemTypeBase string
	// ErrorWriter, when set, writes every HTTP error answer instead of
	// ErrorFormat's body: it sets Content-Type and writes e.Status and a body
	// that keeps e.Code. Retry-After and Connection: close are already set;
	// the metrics count whatever it writes. Defaults to nil.
	ErrorWriter func(w http.ResponseWriter, r *http.Request, e ErrorAnswer)
	// Registerer receives the metrics. Defaults to nil: counted, registered
	// nowhere (never the global registry).
	Registerer prometheus.Registerer
}

// RouteConfig is one route's or Operation's policy. The zero value is a
// fail-closed route with the defaults below.
type RouteConfig struct {
	// Name is the endpoint name: the key's scope_endpoint and the metrics
	// label, at most 1024 bytes of UTF-8. Defaults to Config.RouteName's
	// answer, then to the ServeMux pattern (r.Pattern); with none, keys are
	// scoped by method and path (over 1 KiB: 400 idempotency_scope_invalid)
	// and the label is "unnamed".
	Name string
	// KeyFormat is the form of Idempotency-Key the route accepts: KeyUUID
	// (the ADR) or KeyOpaque (1 to 255 visible ASCII characters or spaces,
	// compared exactly). A refused key is a 400 "Idempotency-Key must be a
	// UUID string" ("... must be 1-255 characters" on an opaque route). An
	// opaque route needs Config.Scope or a MinKeyLength of at least 16:
	// unscoped short keys are guessable. Defaults to KeyUUID.
	KeyFormat KeyFormat
	// MinKeyLength is the shortest key, in bytes, an opaque route (KeyOpaque
	// or ParseKey) or an Operation accepts. Defaults to 0 (1 byte).
	MinKeyLength int
	// ParseKey, when set, parses the route's Idempotency-Key header values
	// instead of KeyFormat: the key to store (1 to 255 bytes of UTF-8
	// without NUL, at least MinKeyLength), or an error for a 400. The route
	// is an opaque route. Defaults to nil.
	ParseKey func(value string) (string, error)
	// FailOpen runs the handler without deduplication when the store is
	// unavailable (billing, account mutations). Defaults to false: the route
	// fails closed with 503 and the handler does not run (orders).
	FailOpen bool
	// TTL is how long a key is remembered: at most 7 days, at least the
	// larger of 1 minute and twice the lease. Defaults to 24h.
	TTL time.Duration
	// RequireKey answers 400 to requests without an Idempotency-Key.
	// Defaults to false: such requests pass through.
	RequireKey bool
	// MaxBodyBytes limits a keyed request's body, held in memory while it is
	// hashed; larger bodies get 413. math.MaxInt64 means no limit but
	// memory. Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes limits the response body (or Do's encoded value)
	// that is recorded; a larger one is sent as it is and recorded without
	// it, so duplicates get 409 idempotency_response_not_stored. Defaults to
	// 1 MiB.
	MaxResponseBytes int64
	// ReplayHeaders are response headers replayed besides Content-Type,
	// Content-Encoding, Location and Content-Language. Set-Cookie,
	// Authorization, WWW-Authenticate, Proxy-*, hop-by-hop headers, Date and
	// Content-Length are refused. Defaults to none.
	ReplayHeaders []string
	// NoReplayMarker replays a JSON object as recorded, without the added
	// "idempotency_replayed": true member (the Idempotent-Replayed header
	// stays). Defaults to false.
	NoReplayMarker bool
	// NoStore never records response bodies, for responses that carry
	// personal data: concurrent duplicates get 409 in flight, and a
	// completed key is released, so a later retry executes again: the route
	// gives up at-most-once for sequential retries. Defaults to false.
	NoStore bool
	// Transactional claims the key inside a database transaction and lends
	// it to the handler (TxFromContext): the claim, the handler's writes and
	// the record commit together, so a process that dies mid-handler leaves
	// nothing behind and the retry executes at once. Needs a TxStore (such
	// as PostgresStore) and a fail-closed route. Defaults to false.
	Transactional bool
	// TxLockWait, on a transactional route, bounds how long a claim (the
	// takeover and the re-read too, not the handler's statements) waits for
	// another open transaction that holds the key before answering 409 in
	// flight; five times it, as the database bounds it (whole seconds, at
	// least 1s, on MySQL 8.0), must stay below Config.StoreTimeout.
	// Defaults to DefaultTxLockWait.
	TxLockWait time.Duration
	// ReleaseOnError, on a transactional route, releases the key when the
	// handler fails (>= 500 or panic) instead of marking it failed: the
	// rollback proves nothing happened. Defaults to false.
	ReleaseOnError bool
	// Codec, on an Operation, encodes the values Do stores. Defaults to
	// encoding/json.
	Codec Codec
	// Scoped declares that every call carries a user scope: Call.Scope on
	// Do, or Config.Scope's answer (the only scope of a gRPC or Connect
	// call, and of an HTTP request), so keys of two users never meet. A
	// call whose scope is empty is then refused before any store call
	// (ErrInvalidScope; 400 or InvalidArgument idempotency_scope_invalid).
	// An Operation, gRPC method or Connect procedure that is not Scoped
	// needs MinKeyLength of at least 16 (a UUID key meets it), or
	// construction fails: one client's short key would otherwise be
	// answered with another's record. An opaque HTTP route guarded by
	// Config.Scope (MinKeyLength below 16) is scoped without it. Defaults
	// to false.
	Scoped bool
	// FollowKillSwitch, on an Operation, makes Do follow Config.Enabled:
	// while it reports off, Do runs the function without a store call and
	// returns CallInfo{Bypassed: true}. HTTP routes, gRPC methods and
	// Connect procedures always follow the switch. Defaults to false: Do
	// deduplicates whatever the switch says.
	FollowKillSwitch bool
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
	rc.MaxBodyBytes = min(cmp.Or(rc.MaxBodyBytes, DefaultMaxBodyBytes), math.MaxInt64-1)
	rc.MaxResponseBytes = cmp.Or(rc.MaxResponseBytes, DefaultMaxResponseBytes)
	rc.TxLockWait = cmp.Or(rc.TxLockWait, DefaultTxLockWait)
	return rc
}

// validate checks a route's policy, defaults filled, under a middleware
// of store s whose lease is lease and whose store calls are bounded by
// storeTimeout.
func (rc *RouteConfig) validate(lease, storeTimeout time.Duration, s Store) error {
	budget := txWaitBudget
	if b, ok := s.(txWaitBudgeter); ok {
		budget = b.TxLockWaitBudget
	}
	floor := max(minTTL, 2*lease)
	switch {
	case !storable(rc.Name):
		return fmt.Errorf("idempotency: RouteConfig.Name must be valid UTF-8, without NUL bytes, at most %d bytes", maxScopeBytes)
	case rc.TTL > MaxTTL:
		return fmt.Errorf("idempotency: RouteConfig.TTL (%v) exceeds the maximum of %v", rc.TTL, MaxTTL)
	case rc.TTL < floor:
		return fmt.Errorf("idempotency: RouteConfig.TTL (%v) is below the minimum of %v (the larger of 1m and twice the lease)", rc.TTL, floor)
	case rc.MaxBodyBytes < 0:
		return fmt.Errorf("idempotency: RouteConfig.MaxBodyBytes must be positive, got %d", rc.MaxBodyBytes)
	case rc.MaxResponseBytes < 0:
		return fmt.Errorf("idempotency: RouteConfig.MaxResponseBytes must be positive, got %d", rc.MaxResponseBytes)
	case rc.TxLockWait < time.Millisecond:
		return fmt.Errorf("idempotency: RouteConfig.TxLockWait must be at least 1ms, got %v", rc.TxLockWait)
	case rc.Transactional && budget(rc.TxLockWait) >= storeTimeout:
		// Each of the claim's tries may wait the bound out once, all in
		// one store call: past the store timeout, a duplicate of a key in
		// flight gets 503 instead of 409.
		return fmt.Errorf("idempotency: RouteConfig.TxLockWait (%v): the claim's lock waits may take %v on this store, which must be below Config.StoreTimeout (%v)",
			rc.TxLockWait, budget(rc.TxLockWait), storeTimeout)
	case rc.ReleaseOnError && !rc.Transactional:
		return errors.New("idempotency: RouteConfig.ReleaseOnError needs RouteConfig.Transactional")
	case rc.Transactional && rc.FailOpen:
		return errors.New("idempotency: RouteConfig.Transactional requires a fail-closed route (FailOpen false)")
	case rc.Transactional && rc.NoStore:
		return errors.New("idempotency: RouteConfig.Transactional cannot be combined with NoStore")
	}
	return nil
}

// txWaitBudgeter is a TxStore whose database bounds a lock wait
// differently from PostgreSQL (sqlstore.Store on MySQL 8.0 counts whole
// seconds): TxLockWaitBudget returns how long one transactional claim
// with lock wait wait may spend waiting on locks, every try counted.
type txWaitBudgeter interface {
	TxLockWaitBudget(wait time.Duration) time.Duration
}

// txWaitBudget is how long one transactional claim may spend waiting on
// locks with the bound wait: PostgreSQL's bound (whole milliseconds,
// rounded up) once per try.
func txWaitBudget(wait time.Duration) time.Duration {
	return time.Duration(pgMillis(wait)) * time.Millisecond * pgRetries
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
