// Package idempotency makes HTTP write endpoints safe to retry.
//
// A client sends "Idempotency-Key: <uuid>". The middleware claims the key in
// a Store with one atomic insert-or-read, runs the wrapped handler at most
// once per (key, user scope, endpoint), records its response, and answers
// every duplicate with a replay of that response, a 409 or a 422. Each route
// chooses to fail closed (no store, no execution: 503) or fail open (no
// store, execute without deduplication).
//
// The HTTP contract, the algorithm and the storage schema are described in
// the README; PostgresStore is the production store, MemoryStore serves a
// single process.
package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
)

// Header names of the HTTP contract.
const (
	// HeaderKey is the request header carrying the client's idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
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

// FlagEnv is the environment variable read by EnabledFromEnv: the ADR's
// kill-switch.
const FlagEnv = "FLAG_IDEMPOTENCY_MIDDLEWARE"

// Config configures a Middleware. The zero value is usable: every field has
// a default.
type Config struct {
	// Lease is how long a claim owns its key. A handler gets Lease minus
	// StoreTimeout to run, so its response can always be recorded within
	// the lease; an in_flight key whose lease is over is stale. Defaults to
	// 30s. Must exceed StoreTimeout.
	Lease time.Duration
	// StoreTimeout bounds every store call; a store that does not answer in
	// time is unavailable. Defaults to 2s.
	StoreTimeout time.Duration
	// BodyTimeout bounds reading a keyed request's body, where the
	// connection supports read deadlines (http.ResponseController). A body
	// not read whole in time is answered 400 idempotency_body_unreadable
	// with Connection: close, and nothing more of it is read. Defaults to
	// 10s.
	BodyTimeout time.Duration
	// Scope returns the user scope of a request: keys of different scopes
	// never meet. "" means unscoped. Run the middleware after the session
	// middleware so the user is known. Defaults to a function returning "".
	// A scope that is not valid UTF-8, holds a NUL byte or is longer than
	// 1024 bytes is refused with 400 idempotency_scope_invalid before any
	// claim: the store could not hold it.
	Scope func(*http.Request) string
	// RouteName, when set, names a request's route when its RouteConfig.Name
	// is empty, before r.Pattern is consulted: for routers that do not set
	// r.Pattern (gorilla/mux, gin, echo) or set it only partly. It must
	// return the route's template (for example "POST /accounts/{id}/orders"),
	// never the raw path: the name becomes a metrics label and the key's
	// scope_endpoint, so a path with ids in it would explode the label set
	// and scope one key per path. "" falls through to r.Pattern. The
	// contrib modules provide one per framework. Defaults to nil.
	RouteName func(*http.Request) string
	// Enabled is the kill-switch, asked on every request: false makes every
	// route a pure pass-through. Defaults to EnabledFromEnv.
	Enabled func(*http.Request) bool
	// OnReplay, when set, is called synchronously before every replay is
	// sent, so the host can write its own audit row. Its context is
	// detached from the client and bounded by StoreTimeout. When it returns
	// an error the replay is not sent on a fail-closed route, which answers
	// 503 idempotency_store_unavailable (the client retries the same key),
	// and is sent anyway on a fail-open route, with a WARN log. Defaults to
	// nil.
	OnReplay func(context.Context, ReplayEvent) error
	// Logger receives WARN and ERROR events; bodies are never logged.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics. Defaults to nil: metrics are counted
	// but registered nowhere (never the global registry).
	Registerer prometheus.Registerer
}

// RouteConfig is one route's policy. The zero value is a fail-closed route
// with the defaults below.
type RouteConfig struct {
	// Name is the endpoint name: the key's scope_endpoint and the metrics
	// label. Defaults to Config.RouteName's answer, then to the ServeMux
	// pattern that matched (r.Pattern); with
	// none, keys are scoped by method and path and the label is
	// "unnamed" (a path longer than 1 KiB is then refused with 400
	// idempotency_scope_invalid). At most 1024 bytes of UTF-8.
	Name string
	// FailOpen runs the handler without deduplication when the store is
	// unavailable (billing, account mutations). Defaults to false: the route
	// fails closed with 503 and the handler does not run (orders).
	FailOpen bool
	// TTL is how long a key is remembered. Defaults to 24h; at most 7 days,
	// at least the larger of 1 minute and twice the lease.
	TTL time.Duration
	// RequireKey answers 400 to requests without an Idempotency-Key.
	// Defaults to false: such requests pass through.
	RequireKey bool
	// MaxBodyBytes limits a keyed request's body; larger bodies get 413.
	// The body is held in memory while it is hashed. math.MaxInt64 means no
	// limit but memory: values above math.MaxInt64-1 are clamped to it, so
	// one byte past the limit can still be read and seen. Defaults to 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes limits the response body that is recorded; a larger
	// response is sent as it is and recorded without its body, so
	// duplicates get 409 idempotency_response_not_stored. Defaults to 1 MiB.
	MaxResponseBytes int64
	// ReplayHeaders are response headers replayed in addition to
	// Content-Type, Content-Encoding, Location and Content-Language. Set-Cookie,
	// Authorization, WWW-Authenticate, Proxy-*, hop-by-hop headers, Date and
	// Content-Length are refused. Defaults to none.
	ReplayHeaders []string
	// NoStore never records response bodies, for responses that carry
	// personal data: concurrent duplicates get 409 in flight, and on
	// completion the key is released, so a later retry executes again. The
	// route gives up at-most-once for sequential retries. Defaults to false.
	NoStore bool
	// Transactional begins a database transaction after the claim and hands
	// it to the handler (TxFromContext); the handler's writes and the
	// completed record commit together, and a stale key is reclaimed safely.
	// Requires a *PostgresStore and a fail-closed route. Defaults to false.
	Transactional bool
	// ReleaseOnError, on a transactional route, releases the key when the
	// handler fails (>= 500 or panic) instead of marking it failed: the
	// rollback proves nothing happened, so a retry may execute. Defaults to
	// false.
	ReleaseOnError bool
}

// ReplayEvent describes one replay, for OnReplay.
type ReplayEvent struct {
	Key            string        // the normalised idempotency key
	Scope          string        // the user scope
	Endpoint       string        // the route's scope_endpoint
	RequestHash    string        // the request hash, the original's and the duplicate's
	OriginalStatus int           // the status being replayed
	OriginalTime   time.Time     // when the original request claimed the key
	Request        *http.Request // the duplicate being answered
}

// Middleware wraps routes with idempotency keys. Build one with New, then
// wrap each route with Route. It is safe for concurrent use.
type Middleware struct {
	store   Store
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	ops     storeOps

	routeMetrics sync.Map // endpoint label -> *routeMetrics
}

// New returns a Middleware over store. It fails when cfg is invalid or the
// metrics cannot be registered.
func New(store Store, cfg Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: store is nil")
	}
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, DefaultBodyTimeout)
	if cfg.Scope == nil {
		cfg.Scope = func(*http.Request) string { return "" }
	}
	if cfg.Enabled == nil {
		cfg.Enabled = EnabledFromEnv
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), metrics: met}
	m.ops = newStoreOps(met)
	return m, nil
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
	}
	return nil
}

// Route returns the middleware for one route with policy rc. It fails when
// rc is invalid, so bad configuration never surfaces per request.
func (m *Middleware) Route(rc RouteConfig) (func(http.Handler) http.Handler, error) {
	rt, err := m.newRoute(rc)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		r := *rt
		r.next = next
		return &r
	}, nil
}

// MustRoute is like Route but panics when rc is invalid. It suits routes
// built once at start-up.
func (m *Middleware) MustRoute(rc RouteConfig) func(http.Handler) http.Handler {
	mw, err := m.Route(rc)
	if err != nil {
		panic(err)
	}
	return mw
}

// EnabledFromEnv is the default kill-switch: it reports false when
// FLAG_IDEMPOTENCY_MIDDLEWARE is "0", "false", "off" or "no" (any case,
// surrounding white space ignored), and true when it is unset or anything
// else.
func EnabledFromEnv(*http.Request) bool {
	return flagEnabled(os.Getenv(FlagEnv))
}

// EnabledFrom is EnabledFromEnv reading FLAG_IDEMPOTENCY_MIDDLEWARE through
// getenv (a flag service, a test's environment) on every request.
func EnabledFrom(getenv func(string) string) func(*http.Request) bool {
	return func(*http.Request) bool { return flagEnabled(getenv(FlagEnv)) }
}

func flagEnabled(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "0", "false", "off", "no":
		return false
	}
	return true
}

type ctxKey int

const (
	keyCtxKey ctxKey = iota
	txCtxKey
)

// KeyFromContext returns the request's normalised idempotency key inside a
// wrapped handler, for example to forward it to a broker as its client
// order id. It reports false when the request carried no key or the
// kill-switch was off.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey).(string)
	return k, ok
}

// withKey returns r with its idempotency key in the context.
func withKey(r *http.Request, key string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), keyCtxKey, key))
}

// parseKey validates an Idempotency-Key header value and returns it in
// lower case: a UUID in its 36-character form, optionally as a quoted
// structured-field string; optional white space around it is ignored.
func parseKey(v string) (string, bool) {
	v = strings.Trim(v, " \t")
	if len(v) == 38 && v[0] == '"' && v[37] == '"' {
		v = v[1:37]
	}
	if len(v) != 36 {
		return "", false
	}
	u, err := uuid.Parse(v) // at length 36 only the 8-4-4-4-12 hex form parses
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// storeOps holds a pre-labelled histogram observer per store operation.
type storeOps struct {
	met                                                               *metrics
	claim, complete, fail, release, takeover, reclaim, cleanup, erase prometheus.Observer
}

func newStoreOps(met *metrics) storeOps {
	o := func(op string) prometheus.Observer { return met.storeDuration.WithLabelValues(op) }
	return storeOps{met: met, claim: o("claim"), complete: o("complete"), fail: o("fail"), release: o("release"),
		takeover: o("takeover"), reclaim: o("reclaim"), cleanup: o("cleanup"), erase: o("erase")}
}

// storeCall runs one store operation of a request under its own deadline,
// detached from the client's connection, and records its duration and any
// error.
func storeCall[T any](m *Middleware, parent context.Context, op string, obs prometheus.Observer,
	fn func(context.Context) (T, error)) (T, error) {
	return timedCall(m, context.WithoutCancel(parent), op, obs, fn)
}

// timedCall runs one store operation under ctx and the store timeout, and
// records its duration and any error. Cleanup and Erase use it directly:
// their caller's cancellation and deadline apply too.
func timedCall[T any](m *Middleware, ctx context.Context, op string, obs prometheus.Observer,
	fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	start := time.Now()
	v, err := fn(ctx)
	cancel()
	obs.Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, ErrNotOwner) {
		m.metrics.storeErrors.WithLabelValues(op, storeReason(err)).Inc()
	}
	return v, err
}

// Cleanup deletes expired rows in batches of batch rows (1000 when batch <=
// 0), each under ctx and the store timeout, until a batch comes back short
// or ctx ends. It returns how many rows it deleted. In-flight rows whose
// lease still runs are never deleted.
func (m *Middleware) Cleanup(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := timedCall(m, ctx, "cleanup", m.ops.cleanup, func(c context.Context) (int64, error) {
			return m.store.DeleteExpired(c, batch)
		})
		total += n
		m.metrics.cleanupDeleted.Add(float64(n))
		if err != nil {
			return total, err
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// RunJanitor calls Cleanup every interval until ctx is done, logging
// failures; it returns when ctx is done. Run it in its own goroutine.
func (m *Middleware) RunJanitor(ctx context.Context, interval time.Duration, batch int) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := m.Cleanup(ctx, batch)
			if err != nil && ctx.Err() == nil {
				m.log.Error("idempotency: cleanup failed", "deleted", n, "error", err)
			}
		}
	}
}

// Erase deletes every row of a user scope except in_flight rows still inside
// their lease, which it returns (the GDPR erasure step). A key retried after
// erasure is new. It runs under ctx and the store timeout, whichever ends
// first.
func (m *Middleware) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	return timedCall(m, ctx, "erase", m.ops.erase, func(c context.Context) (ErasureResult, error) {
		return m.store.DeleteScope(c, scope)
	})
}

func (m *Middleware) metricsFor(label string) *routeMetrics {
	if rm, ok := m.routeMetrics.Load(label); ok {
		return rm.(*routeMetrics)
	}
	rm, _ := m.routeMetrics.LoadOrStore(label, m.metrics.forEndpoint(label))
	return rm.(*routeMetrics)
}

// itoa avoids fmt on the hot path.
func itoa(n int) string { return strconv.Itoa(n) }

// route is one wrapped handler with its validated policy.
type route struct {
	m              *Middleware
	next           http.Handler
	name           string
	failOpen       bool
	ttl            time.Duration
	requireKey     bool
	maxBody        int64
	maxResponse    int64
	replayHeaders  []string // canonical names, allow-list for recording
	noStore        bool
	tx             *txRunner // non-nil on transactional routes
	releaseOnError bool
}

func (m *Middleware) newRoute(rc RouteConfig) (*route, error) {
	rt := &route{
		m:              m,
		name:           rc.Name,
		failOpen:       rc.FailOpen,
		ttl:            cmp.Or(rc.TTL, DefaultTTL),
		requireKey:     rc.RequireKey,
		maxBody:        min(cmp.Or(rc.MaxBodyBytes, DefaultMaxBodyBytes), math.MaxInt64-1),
		maxResponse:    cmp.Or(rc.MaxResponseBytes, DefaultMaxResponseBytes),
		noStore:        rc.NoStore,
		releaseOnError: rc.ReleaseOnError,
	}
	floor := max(minTTL, 2*m.cfg.Lease)
	switch {
	case !storable(rc.Name):
		return nil, fmt.Errorf("idempotency: RouteConfig.Name must be valid UTF-8, without NUL bytes, at most %d bytes", maxScopeBytes)
	case rt.ttl > MaxTTL:
		return nil, fmt.Errorf("idempotency: RouteConfig.TTL (%v) exceeds the maximum of %v", rt.ttl, MaxTTL)
	case rt.ttl < floor:
		return nil, fmt.Errorf("idempotency: RouteConfig.TTL (%v) is below the minimum of %v (the larger of 1m and twice the lease)", rt.ttl, floor)
	case rt.maxBody < 0:
		return nil, fmt.Errorf("idempotency: RouteConfig.MaxBodyBytes must be positive, got %d", rt.maxBody)
	case rt.maxResponse < 0:
		return nil, fmt.Errorf("idempotency: RouteConfig.MaxResponseBytes must be positive, got %d", rt.maxResponse)
	case rc.ReleaseOnError && !rc.Transactional:
		return nil, errors.New("idempotency: RouteConfig.ReleaseOnError needs RouteConfig.Transactional")
	}
	headers, err := replayAllowList(rc.ReplayHeaders)
	if err != nil {
		return nil, err
	}
	rt.replayHeaders = headers
	if rc.Transactional {
		if rc.FailOpen {
			return nil, errors.New("idempotency: RouteConfig.Transactional requires a fail-closed route (FailOpen false)")
		}
		if rc.NoStore {
			return nil, errors.New("idempotency: RouteConfig.Transactional cannot be combined with NoStore")
		}
		runner, err := newTxRunner(m.store)
		if err != nil {
			return nil, err
		}
		rt.tx = runner
	}
	return rt, nil
}

// Precomputed answers of the HTTP contract.
var (
	bodyMissingKey     = []byte(`{"error":"Idempotency-Key header is required"}`)
	bodyInvalidKey     = []byte(`{"error":"Idempotency-Key must be a UUID string"}`)
	bodyInvalidScope   = []byte(`{"error":"idempotency_scope_invalid"}`)
	bodyTooLarge       = []byte(`{"error":"idempotency_body_too_large"}`)
	bodyUnreadable     = []byte(`{"error":"idempotency_body_unreadable"}`)
	bodyUnavailable    = []byte(`{"error":"idempotency_store_unavailable"}`)
	bodyMismatch       = []byte(`{"error":"idempotency_key_body_mismatch"}`)
	bodyPreviousFailed = []byte(`{"error":"idempotency_previous_failed"}`)
	bodyInFlight       = []byte(`{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	bodyOutcomeUnknown = []byte(`{"error":"idempotency_outcome_unknown"}`)
	bodyRespTooLarge   = []byte(`{"error":"idempotency_response_too_large"}`)
)

// maxClaimRounds bounds the claim loop: a takeover or reclaim that loses
// its race claims again, which can only repeat while other requests keep
// winning the same key.
const maxClaimRounds = 4

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := rt.m
	if !m.cfg.Enabled(r) {
		m.metrics.bypasses.WithLabelValues(rt.label(r), reasonDisabled).Inc()
		rt.passThrough(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if rt.requireKey {
			rt.reject(w, r, http.StatusBadRequest, reasonMissingKey, bodyMissingKey)
			return
		}
		rt.passThrough(w, r)
		return
	}
	key, ok := "", false
	if len(values) == 1 {
		key, ok = parseKey(values[0])
	}
	if !ok {
		rt.reject(w, r, http.StatusBadRequest, reasonInvalidKey, bodyInvalidKey)
		return
	}
	body, err := readBody(w, r, rt.maxBody, m.cfg.BodyTimeout)
	if err != nil {
		// The rest of the body stays unread: the connection cannot carry
		// another request.
		w.Header().Set("Connection", "close")
		if errors.Is(err, errBodyTooLarge) {
			rt.reject(w, r, http.StatusRequestEntityTooLarge, reasonBodyTooLarge, bodyTooLarge)
		} else {
			rt.reject(w, r, http.StatusBadRequest, reasonBodyUnreadable, bodyUnreadable)
		}
		return
	}
	endpoint, label := rt.endpoint(r)
	scope := m.cfg.Scope(r)
	if !storable(scope) || !storable(endpoint) {
		// A value the store cannot hold would fail every claim of this
		// key alike: refuse it rather than treat it as an outage (which a
		// fail-open route would run without deduplication, every time).
		m.log.Warn("idempotency: scope or endpoint cannot be stored (not UTF-8, a NUL byte, or too long)",
			"endpoint", label, "scope_bytes", len(scope), "endpoint_bytes", len(endpoint))
		rt.reject(w, r, http.StatusBadRequest, reasonInvalidScope, bodyInvalidScope)
		return
	}
	rm := m.metricsFor(label)
	req := ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    endpoint,
		RequestHash: requestHash(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, body),
		TTL:         rt.ttl,
		Lease:       m.cfg.Lease,
		Reclaimable: rt.tx != nil,
	}
	// The key goes into the handler's context only on the paths that run
	// the handler (winner, fail-open bypass): a replay allocates no request.
	for round := 1; ; round++ {
		claimedAt := time.Now()
		reclaimed := false
		res, err := storeCall(m, r.Context(), "claim", m.ops.claim, func(c context.Context) (ClaimResult, error) {
			return m.store.Claim(c, req)
		})
		if err == nil && !res.Won {
			// An expired row is a new key; a stale in_flight row on a
			// transactional route was rolled back and may be reclaimed.
			rec := res.Record
			expired := rec.Expired && (rec.Status != StatusInFlight || rec.LeaseOver)
			// Only rows a transactional route claimed: another owner's
			// effects did not roll back with it.
			reclaimable := rt.tx != nil && rec.Reclaimable && rec.Status == StatusInFlight && rec.LeaseOver && rec.RequestHash == req.RequestHash
			if (expired || reclaimable) && round == maxClaimRounds {
				// Others keep winning this key: it is in flight.
				rm.hit.Inc()
				w.Header().Set("Retry-After", "5")
				m.metrics.conflicts.WithLabelValues(label, reasonInFlight).Inc()
				writeJSON(w, http.StatusConflict, bodyInFlight)
				return
			}
			switch {
			case expired:
				res, err = storeCall(m, r.Context(), "takeover", m.ops.takeover, func(c context.Context) (ClaimResult, error) {
					return m.store.Takeover(c, rec.Fence(), req)
				})
			case reclaimable:
				res, err = storeCall(m, r.Context(), "reclaim", m.ops.reclaim, func(c context.Context) (ClaimResult, error) {
					return m.store.Reclaim(c, rec.Fence(), req)
				})
				reclaimed = res.Won
			}
			if err == nil && !res.Won && res.Record.ID == 0 {
				if round < maxClaimRounds {
					continue // lost the takeover or reclaim: read the row again
				}
				err = &StoreError{Op: "claim", Reason: ReasonConflict, Err: errors.New("the key's row kept changing")}
			}
		}
		if err != nil {
			rt.storeUnavailable(w, withKey(r, key), label, "claim", err)
			return
		}
		if res.Won {
			rm.miss.Inc()
			if reclaimed {
				m.log.Warn("idempotency: reclaimed a stale key; its previous attempt's transaction rolled back",
					"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "attempt", res.Record.Attempt)
			}
			rt.execute(w, withKey(r, key), req, res.Record, claimedAt, rm)
			return
		}
		rm.hit.Inc()
		rt.answerDuplicate(w, r, req, res.Record, label, rm)
		return
	}
}

// answerDuplicate answers a request whose key belongs to a live row.
func (rt *route) answerDuplicate(w http.ResponseWriter, r *http.Request, req ClaimRequest, rec Record, label string, rm *routeMetrics) {
	conflict := func(status int, reason string, body []byte) {
		rt.m.metrics.conflicts.WithLabelValues(label, reason).Inc()
		writeJSON(w, status, body)
	}
	if rec.RequestHash != req.RequestHash {
		conflict(http.StatusUnprocessableEntity, reasonBodyMismatch, bodyMismatch)
		return
	}
	switch rec.Status {
	case StatusCompleted:
		if rec.Response.BodyKind == BodyNone {
			rt.m.metrics.conflicts.WithLabelValues(label, reasonNotStored).Inc()
			writeJSON(w, http.StatusConflict, notStoredBody(rec.Response.Status))
			return
		}
		rt.replay(w, r, req, rec, rm)
	case StatusFailed:
		conflict(http.StatusConflict, reasonPreviousFailed, bodyPreviousFailed)
	default:
		if !rec.LeaseOver {
			w.Header().Set("Retry-After", "5")
			conflict(http.StatusConflict, reasonInFlight, bodyInFlight)
			return
		}
		rt.m.log.Warn("idempotency: stale in-flight key, outcome unknown",
			"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "locked_at", rec.LockedAt)
		conflict(http.StatusConflict, reasonOutcomeUnknown, bodyOutcomeUnknown)
	}
}

// replay sends a completed key's stored response, once the host's replay
// hook has audited it.
func (rt *route) replay(w http.ResponseWriter, r *http.Request, req ClaimRequest, rec Record, rm *routeMetrics) {
	if hook := rt.m.cfg.OnReplay; hook != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rt.m.cfg.StoreTimeout)
		err := hook(ctx, ReplayEvent{
			Key: req.Key, Scope: req.Scope, Endpoint: req.Endpoint, RequestHash: rec.RequestHash,
			OriginalStatus: rec.Response.Status, OriginalTime: rec.CreatedAt, Request: r,
		})
		cancel()
		if err != nil {
			if !rt.failOpen {
				rt.m.log.Error("idempotency: replay hook failed; replay refused",
					"endpoint", req.Endpoint, "key", req.Key, "error", err)
				_, label := rt.endpoint(r)
				rt.m.metrics.rejections.WithLabelValues(label, reasonStoreUnavailable).Inc()
				w.Header().Set("Retry-After", "1")
				writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
				return
			}
			rt.m.log.Warn("idempotency: replay hook failed; replaying anyway (fail-open route)",
				"endpoint", req.Endpoint, "key", req.Key, "error", err)
		}
	}
	rm.replay.Inc()
	writeReplay(w, rec.Response)
}

// storeUnavailable applies the route's policy to a failed claim.
func (rt *route) storeUnavailable(w http.ResponseWriter, r *http.Request, label, op string, err error) {
	reason := storeReason(err)
	if reason == ReasonConflict {
		// Contention, not an outage: other requests keep changing this
		// key's row (serialization failures past the retries, a takeover
		// lost every round). One of them owns the key, so a fail-open
		// bypass would run the handler beside it: the key is in flight.
		rt.m.metrics.conflicts.WithLabelValues(label, reasonInFlight).Inc()
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusConflict, bodyInFlight)
		return
	}
	if reason == ReasonData {
		// A store that refuses this request's values is not down: it
		// would refuse every retry alike, so a fail-open bypass would run
		// each one, and a 503 would invite retries that cannot succeed.
		rt.m.log.Warn("idempotency: the store refused the request's scope or endpoint",
			"endpoint", label, "operation", op, "error", err)
		rt.m.metrics.rejections.WithLabelValues(label, reasonInvalidScope).Inc()
		writeJSON(w, http.StatusBadRequest, bodyInvalidScope)
		return
	}
	// Nor is a full memory store down: any client can fill it on purpose,
	// and must not earn a bypass by doing so.
	if rt.failOpen && reason != ReasonFull {
		rt.m.log.Warn("idempotency: store unavailable, running without deduplication",
			"endpoint", label, "operation", op, "reason", reason, "error", err)
		rt.m.metrics.bypasses.WithLabelValues(label, reasonStoreUnavailable).Inc()
		rt.next.ServeHTTP(w, r)
		return
	}
	rt.m.log.Warn("idempotency: store unavailable, rejecting",
		"endpoint", label, "operation", op, "reason", reason, "error", err)
	rt.m.metrics.rejections.WithLabelValues(label, reasonStoreUnavailable).Inc()
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
}

// reject answers a request refused before any claim.
func (rt *route) reject(w http.ResponseWriter, r *http.Request, status int, reason string, body []byte) {
	rt.m.metrics.rejections.WithLabelValues(rt.label(r), reason).Inc()
	writeJSON(w, status, body)
}

// passThrough runs the handler with no idempotency tracking. A
// transactional route still gets its transaction, so the handler has one
// shape.
func (rt *route) passThrough(w http.ResponseWriter, r *http.Request) {
	if rt.tx != nil {
		rt.tx.passThrough(rt, w, r)
		return
	}
	rt.next.ServeHTTP(w, r)
}

// endpoint returns the key's scope_endpoint and the metrics label.
func (rt *route) endpoint(r *http.Request) (endpoint, label string) {
	name := rt.name
	if name == "" && rt.m.cfg.RouteName != nil {
		name = rt.m.cfg.RouteName(r)
	}
	if name == "" {
		name = r.Pattern
	}
	if name == "" {
		return r.Method + " " + r.URL.EscapedPath(), unnamedEndpoint
	}
	return name, name
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

func (rt *route) label(r *http.Request) string {
	_, label := rt.endpoint(r)
	return label
}

// execute runs the handler for a won claim, records its outcome, then sends
// the response.
func (rt *route) execute(w http.ResponseWriter, r *http.Request, req ClaimRequest, own Record, claimedAt time.Time, rm *routeMetrics) {
	if rt.tx != nil {
		rt.tx.execute(rt, w, r, req, own, claimedAt, rm)
		return
	}
	m := rt.m
	// The handler is detached from the client's connection (a client that
	// hangs up does not cancel an order half-way) and must finish in time
	// for its record to be written inside the lease.
	leaseEnd := claimedAt.Add(m.cfg.Lease)
	fence := own.Fence()
	if rt.tooLate(leaseEnd) {
		rt.giveBack(w, r, req, fence, rm)
		return
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), leaseEnd.Add(-m.cfg.StoreTimeout))
	defer cancel()
	rec := newRecorder(w, rt.maxResponse, false)
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked (or called runtime.Goexit, where p is nil):
		// record the failure, then re-raise.
		p := recover()
		rt.record(r, req, fence, leaseEnd, rm, outcomeFail, Response{})
		if p != nil {
			panic(p)
		}
	}()
	rt.next.ServeHTTP(rec, r.WithContext(ctx))
	finished = true
	cancel()

	status := rec.statusCode()
	switch {
	case status == http.StatusTooManyRequests || rt.noStore && status < 500:
		rt.record(r, req, fence, leaseEnd, rm, outcomeRelease, Response{})
	case status >= 500:
		rt.record(r, req, fence, leaseEnd, rm, outcomeFail, Response{})
	default:
		rt.record(r, req, fence, leaseEnd, rm, outcomeComplete, rec.response(rt.replayHeaders))
	}
	rec.finish()
}

// tooLate reports whether the handler's deadline (the lease's end less the
// store timeout) passed before it could start, because the claim (or a
// transactional route's BEGIN) was slow. Such a handler is not run with a
// dead context, which would record its failure against the key: the key is
// given back instead (giveBack).
func (rt *route) tooLate(leaseEnd time.Time) bool {
	return !time.Now().Before(leaseEnd.Add(-rt.m.cfg.StoreTimeout))
}

// giveBack releases a won key whose handler never ran and asks the client
// to retry.
func (rt *route) giveBack(w http.ResponseWriter, r *http.Request, req ClaimRequest, f Fence, rm *routeMetrics) {
	m := rt.m
	// Nothing ran, so the release may be retried (fenced) for a while: a
	// key left in flight would answer outcome_unknown for its whole TTL.
	// Bounded, so the client still gets its 503 soon.
	rt.record(r, req, f, time.Now().Add(2*m.cfg.StoreTimeout), rm, outcomeRelease, Response{})
	m.log.Warn("idempotency: the store was too slow to leave the handler any time; key released",
		"endpoint", req.Endpoint, "key", req.Key)
	_, label := rt.endpoint(r)
	m.metrics.rejections.WithLabelValues(label, reasonStoreUnavailable).Inc()
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, bodyUnavailable)
}

type outcome int

const (
	outcomeComplete outcome = iota
	outcomeFail
	outcomeRelease
)

// record writes a handler's outcome, retrying while the lease allows. A
// record that cannot be written leaves the key in flight: it is never
// executed again, and later answers idempotency_outcome_unknown.
func (rt *route) record(r *http.Request, req ClaimRequest, f Fence, leaseEnd time.Time, rm *routeMetrics, o outcome, resp Response) {
	m := rt.m
	var op string
	var obs prometheus.Observer
	var call func(context.Context) (struct{}, error)
	switch o {
	case outcomeComplete:
		op, obs = "complete", m.ops.complete
		call = func(c context.Context) (struct{}, error) { return struct{}{}, m.store.Complete(c, f, resp) }
	case outcomeFail:
		op, obs = "fail", m.ops.fail
		call = func(c context.Context) (struct{}, error) { return struct{}{}, m.store.Fail(c, f) }
	default:
		op, obs = "release", m.ops.release
		call = func(c context.Context) (struct{}, error) { return struct{}{}, m.store.Release(c, f) }
	}
	backoff := 25 * time.Millisecond
	for try := 1; ; try++ {
		_, err := storeCall(m, r.Context(), op, obs, call)
		switch {
		case err == nil:
			return
		case errors.Is(err, ErrNotOwner) && try > 1:
			// The earlier attempt may have landed with its reply lost.
			m.log.Warn("idempotency: outcome already recorded or key taken over; an earlier attempt's reply was lost",
				"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "operation", op)
			return
		case errors.Is(err, ErrNotOwner):
			m.log.Error("idempotency: key was taken over while its handler ran; outcome not recorded",
				"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "operation", op)
			rm.recordFailures.Inc()
			return
		case storeReason(err) == ReasonData, time.Now().Add(backoff + m.cfg.StoreTimeout).After(leaseEnd):
			// A refused value fails every retry alike: do not keep the
			// client waiting for the lease.
			m.log.Error("idempotency: could not record the outcome; the key stays in flight",
				"endpoint", req.Endpoint, "scope", req.Scope, "key", req.Key, "operation", op,
				"reason", storeReason(err), "error", err)
			rm.recordFailures.Inc()
			return
		}
		time.Sleep(backoff) // back off before retrying a failing store
		backoff = min(2*backoff, time.Second)
	}
}
