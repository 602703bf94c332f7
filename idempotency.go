package idempotency

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Header names of the HTTP contract.
const (
	// HeaderKey is the request header carrying the client's idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderExpires carries the key's expires_at, to the second (IMF-fixdate),
	// on every answer that read or wrote its row.
	HeaderExpires = "Idempotency-Expires"
)

// Middleware wraps routes with idempotency keys. Build one with New, then
// wrap each route with Route. It is safe for concurrent use.
type Middleware struct {
	store     Store
	cfg       Config
	log       *slog.Logger
	metrics   *metrics
	ops       storeOps
	bodies    [numAnswers][]byte // each answer's body in cfg.ErrorFormat
	scoped    bool               // Config.Scope was set: opaque keys are guarded by it
	ownSwitch bool               // Config.Enabled was set: the host's own kill-switch

	routeMetrics sync.Map      // endpoint label -> *routeMetrics
	givingBack   chan struct{} // one token per key being given back in the background (give_back.go)
	rereads      rereads       // the coalesced re-reads of waiting duplicates (wait.go)
}

// New returns a Middleware over store. It fails when cfg is invalid or the
// metrics cannot be registered.
func New(store Store, cfg Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: store is nil")
	}
	scoped, ownSwitch := cfg.Scope != nil, cfg.Enabled != nil
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: cfg, log: newLogger(&cfg), metrics: met, ops: newStoreOps(met),
		givingBack: make(chan struct{}, maxGivingBack)}
	m.scoped, m.ownSwitch = scoped, ownSwitch
	m.errorBodies()
	return m, nil
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

// MustRoute is Route for routes built at start-up: it panics when rc is
// invalid.
func (m *Middleware) MustRoute(rc RouteConfig) func(http.Handler) http.Handler {
	mw, err := m.Route(rc)
	if err != nil {
		panic(err)
	}
	return mw
}

// policy is the engine's part of a validated RouteConfig: what every entry
// point (an HTTP route, an Operation) applies to its calls.
type policy struct {
	failOpen       bool
	ttl            time.Duration
	grace          time.Duration // ExpiredRefuse's: the row is a tombstone that long after ttl; 0 otherwise
	maxResponse    int64
	noStore        bool
	txStore        TxStore // non-nil on transactional routes
	txLockWait     time.Duration
	releaseOnError bool
	reconcile      func(context.Context, ReconcileInfo) (any, error) // RouteConfig.Reconcile
	reconcileWait  time.Duration                                     // RouteConfig.ReconcileTimeout, defaulted
	waitInFlight   time.Duration                                     // how long a duplicate of a key in flight waits for its answer (wait.go)
	heartbeat      bool                                              // RouteConfig.Heartbeat: the lease is renewed while the handler runs
	maxRun         time.Duration                                     // RouteConfig.MaxRun: a Heartbeat handler's deadline after its claim
}

// newPolicy validates rc, defaults filled, and returns its policy.
func (m *Middleware) newPolicy(rc RouteConfig) (policy, error) {
	if err := rc.validate(m.cfg.Lease, m.cfg.StoreTimeout, m.store); err != nil {
		return policy{}, err
	}
	ts, err := rc.txStore(m.store)
	if err != nil {
		return policy{}, err
	}
	if rc.Reconcile != nil && !canReconcile(m.store) {
		return policy{}, errNoReconcile
	}
	return policy{
		failOpen:       rc.FailOpen,
		ttl:            rc.TTL,
		grace:          rc.Grace,
		maxResponse:    rc.MaxResponseBytes,
		noStore:        rc.NoStore,
		txStore:        ts,
		txLockWait:     rc.TxLockWait,
		releaseOnError: rc.ReleaseOnError,
		reconcile:      rc.Reconcile,
		reconcileWait:  cmp.Or(rc.ReconcileTimeout, m.cfg.StoreTimeout),
		waitInFlight:   rc.WaitInFlight,
		heartbeat:      rc.Heartbeat,
		maxRun:         rc.MaxRun,
	}, nil
}

// route is one wrapped handler: the HTTP adapter's part of its policy
// beside the engine's.
type route struct {
	policy
	m             *Middleware
	next          http.Handler
	name          string
	requireKey    bool
	maxBody       int64
	replayHeaders []string // canonical names, allow-list for recording
	parseKey      keyParser
	invalidKey    answer // the 400 of a refused key, worded for the route's format
	marker        bool   // add "idempotency_replayed": true to replayed JSON objects
	needScope     bool   // a request whose scope is empty is refused (keys.go, needsScope)
	plain         bool   // no transaction, no Observer, the key optional: a keyless request just passes (passKeyless)
}

func (m *Middleware) newRoute(rc RouteConfig) (*route, error) {
	rc = rc.withDefaults()
	p, err := m.newPolicy(rc)
	if err != nil {
		return nil, err
	}
	headers, err := replayAllowList(rc.ReplayHeaders)
	if err != nil {
		return nil, err
	}
	if rc.Codec != nil {
		return nil, errors.New("idempotency: RouteConfig.Codec applies to Operations only")
	}
	if reservedName(rc.Name) {
		return nil, errors.New("idempotency: RouteConfig.Name may not look like an Operation's endpoint (do:<name>, or scheme:/path)")
	}
	if err := rc.validateKeys(m.scoped); err != nil {
		return nil, err
	}
	if rc.FollowKillSwitch {
		return nil, errors.New("idempotency: RouteConfig.FollowKillSwitch applies to Operations only: HTTP routes always follow the kill-switch")
	}
	parse, invalid := rc.newKeyParser()
	return &route{
		policy:        p,
		m:             m,
		name:          rc.Name,
		requireKey:    rc.RequireKey,
		maxBody:       rc.MaxBodyBytes,
		replayHeaders: headers,
		parseKey:      parse,
		invalidKey:    invalid,
		marker:        !rc.NoReplayMarker,
		needScope:     rc.needsScope(),
		plain:         p.txStore == nil && !rc.RequireKey && m.cfg.Observer == nil,
	}, nil
}

// metricsFor returns the counters of one endpoint label.
func (m *Middleware) metricsFor(label string) *routeMetrics {
	if rm, ok := m.routeMetrics.Load(label); ok {
		return rm.(*routeMetrics)
	}
	rm, _ := m.routeMetrics.LoadOrStore(label, m.metrics.forEndpoint(label))
	return rm.(*routeMetrics)
}
