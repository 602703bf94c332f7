package idempotency

import (
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
)

// Middleware wraps routes with idempotency keys. Build one with New, then
// wrap each route with Route. It is safe for concurrent use.
type Middleware struct {
	store   Store
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	ops     storeOps
	bodies  [numAnswers][]byte // each answer's body in cfg.ErrorFormat
	scoped  bool               // Config.Scope was set: opaque keys are guarded by it

	routeMetrics sync.Map      // endpoint label -> *routeMetrics
	forgetting   chan struct{} // one token per claim of unknown outcome being freed (forget.go)
}

// New returns a Middleware over store. It fails when cfg is invalid or the
// metrics cannot be registered.
func New(store Store, cfg Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: store is nil")
	}
	scoped := cfg.Scope != nil
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: cfg, log: newLogger(&cfg), metrics: met, ops: newStoreOps(met),
		forgetting: make(chan struct{}, maxForgetting)}
	m.scoped = scoped
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

// MustRoute is like Route but panics when rc is invalid. It suits routes
// built once at start-up.
func (m *Middleware) MustRoute(rc RouteConfig) func(http.Handler) http.Handler {
	mw, err := m.Route(rc)
	if err != nil {
		panic(err)
	}
	return mw
}

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
	parseKey       keyParser
	invalidKey     answer  // the 400 of a refused key, worded for the route's format
	marker         bool    // add "idempotency_replayed": true to replayed JSON objects
	txStore        TxStore // non-nil on transactional routes
	txLockWait     time.Duration
	releaseOnError bool
}

func (m *Middleware) newRoute(rc RouteConfig) (*route, error) {
	rc = rc.withDefaults()
	if err := rc.validate(m.cfg.Lease, m.cfg.StoreTimeout); err != nil {
		return nil, err
	}
	headers, err := replayAllowList(rc.ReplayHeaders)
	if err != nil {
		return nil, err
	}
	ts, err := rc.txStore(m.store)
	if err != nil {
		return nil, err
	}
	if err := rc.validateKeys(m.scoped); err != nil {
		return nil, err
	}
	parse, invalid := rc.newKeyParser()
	return &route{
		m:              m,
		name:           rc.Name,
		failOpen:       rc.FailOpen,
		ttl:            rc.TTL,
		requireKey:     rc.RequireKey,
		maxBody:        rc.MaxBodyBytes,
		maxResponse:    rc.MaxResponseBytes,
		replayHeaders:  headers,
		noStore:        rc.NoStore,
		parseKey:       parse,
		invalidKey:     invalid,
		marker:         !rc.NoReplayMarker,
		txStore:        ts,
		txLockWait:     rc.TxLockWait,
		releaseOnError: rc.ReleaseOnError,
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
