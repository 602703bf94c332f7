package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// TTLs of the two wrapped routes, by tier.
const (
	ordersTTL  = maxOrdersTTL       // Tier 1: orders
	billingTTL = 7 * 24 * time.Hour // Tier 2: billing, 7 days (round 4 raised MaxTTL to 30 days; the example keeps its window)
)

// janitorInterval is how often expired idempotency keys are deleted.
const janitorInterval = 10 * time.Minute

// memoryStoreMaxRows caps the in-memory idempotency store (memory mode):
// past it, new keys get 503 until rows expire, on the billing route too.
const memoryStoreMaxRows = 100_000

// server is the example's HTTP handler with everything it serves from.
type server struct {
	cfg      config
	log      *slog.Logger
	mode     string // "memory", "postgres" or "mysql"
	data     repo
	billing  *fakeBilling
	sessions sessions
	idem     *idempotency.Middleware
	reg      *prometheus.Registry
	routes   []route // routes.go: registered, and checked for coverage
	handler  http.Handler
	// ordersTransactional reports that orders commit in the middleware's
	// transaction, with the key's record (PostgreSQL mode).
	ordersTransactional bool
}

// ServeHTTP implements http.Handler.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// newServer builds the server for cfg: in memory, or on PostgreSQL when
// cfg.databaseURL (or cfg.pool) is set, in which case it waits for the
// database, migrates it and creates the example's tables. cleanup stops the
// janitor and closes the pool the server opened.
func newServer(ctx context.Context, cfg config) (srv *server, cleanup func(), err error) {
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.getenv == nil {
		cfg.getenv = func(string) string { return "" }
	}
	if len(cfg.sessionSecret) == 0 {
		cfg.sessionSecret, cfg.devSecret = []byte(devSessionSecret), true
	}
	log := cfg.logger
	if cfg.devSecret {
		log.Warn("SESSION_SECRET is unset: session tokens are signed with a public development secret; set it outside development")
	}

	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()

	s := &server{
		cfg:      cfg,
		log:      log,
		billing:  newFakeBilling(),
		sessions: sessions{secret: cfg.sessionSecret},
		reg:      prometheus.NewRegistry(),
	}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var store idempotency.Store
	pool := cfg.pool
	switch {
	case pool == nil && cfg.databaseURL == "":
		s.mode = "memory"
		s.data = newMemoryRepo()
		store = idempotency.NewMemoryStore(idempotency.MemoryMaxRows(memoryStoreMaxRows))
	case pool == nil && isMySQLURL(cfg.databaseURL):
		s.mode = "mysql"
		db, err := connectMySQL(ctx, cfg.databaseURL, cfg.dbWait, log)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = db.Close() })
		s.data = &mysqlRepo{db: db, timeout: cfg.storeTimeout}
		cctx, cancel := context.WithTimeout(ctx, cfg.storeTimeout)
		sqlStore, err := sqlstore.New(cctx, db, sqlstore.Config{Dialect: sqlstore.MySQL, Logger: log})
		if err == nil {
			err = sqlStore.Check(cctx)
		}
		cancel()
		if err != nil {
			return nil, nil, err
		}
		store = sqlStore
	default:
		s.mode = "postgres"
		if pool == nil {
			pool, err = connectPostgres(ctx, cfg.databaseURL, cfg.dbWait, log)
			if err != nil {
				return nil, nil, err
			}
			closers = append(closers, pool.Close)
		}
		if err := migrateVia(ctx, pool, cfg.migrateURL, cfg.dbWait, log); err != nil {
			return nil, nil, err
		}
		s.data = &pgRepo{pool: pool, timeout: cfg.storeTimeout}
		pgStore := idempotency.NewPostgresStore(pool)
		// An old schema must stop the server here: run against it, every
		// claim fails, and the fail-open billing route would run without
		// deduplication.
		cctx, cancel := context.WithTimeout(ctx, cfg.storeTimeout)
		err := pgStore.Check(cctx)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		store = pgStore
	}
	if store, err = sealStore(ctx, cfg, store); err != nil {
		return nil, nil, err
	}

	derive, err := deriveKeys(cfg)
	if err != nil {
		return nil, nil, err
	}
	s.idem, err = idempotency.New(store, idempotency.Config{
		DeriveKeys:   derive, // live mode: the venue's client_order_ids
		Lease:        cfg.lease,
		StoreTimeout: cfg.storeTimeout,
		// The session middleware runs first and puts the user in the
		// context: keys are scoped by user id.
		Scope: func(ctx context.Context) string {
			uid, _ := userFromContext(ctx)
			return strconv.FormatInt(uid, 10)
		},
		Enabled:    func(context.Context) bool { return !falsy(cfg.getenv(idempotency.FlagEnv)) },
		OnReplay:   s.auditReplay,
		Logger:     log,
		Registerer: s.reg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency middleware: %w", err)
	}

	// Tier 1: fail-closed orders. On PostgreSQL the order and its audit row
	// commit in the middleware's transaction, together with the key's
	// record. Name is left empty: the endpoint is the ServeMux pattern.
	s.ordersTransactional = s.mode != "memory"
	orderRoute, err := s.idem.Route(idempotency.RouteConfig{TTL: ordersTTL, Transactional: s.ordersTransactional,
		Reconcile: s.orderReconcile()}) // live mode: a stale key asks the venue
	if err != nil {
		return nil, nil, fmt.Errorf("order route: %w", err)
	}
	// Tier 2: fail-open billing; the fake provider also deduplicates on
	// the key, as Stripe does, so a bypass is still covered upstream.
	billingRoute, err := s.idem.Route(idempotency.RouteConfig{TTL: billingTTL, FailOpen: true})
	if err != nil {
		return nil, nil, fmt.Errorf("billing route: %w", err)
	}

	s.routes = s.routeTable(orderRoute, billingRoute)
	mux := http.NewServeMux()
	for _, rt := range s.routes {
		mux.Handle(rt.pattern, rt.handler)
	}
	s.handler = s.accessLog(jsonMuxErrors(mux))

	janitorCtx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.idem.RunJanitor(janitorCtx, janitorInterval, 1000)
	}()
	closers = append(closers, func() { stopJanitor(); <-done })
	return s, closeAll, nil
}

// sealStore wraps store in a sealing store when seal keys are given, and
// says at start-up whether responses are sealed and with which key id.
func sealStore(ctx context.Context, cfg config, store idempotency.Store) (idempotency.Store, error) {
	if cfg.sealKeys == nil {
		cfg.logger.Info("stored responses are not sealed (set " + envSealKeys + " or -seal-keys-file to seal them)")
		return store, nil
	}
	sealed, err := idempotency.NewSealingStore(ctx, store, cfg.sealKeys)
	if err != nil {
		return nil, err
	}
	id, _, _ := cfg.sealKeys.ActiveSealKey(ctx)
	cfg.logger.Info("sealing stored responses", "seal_key_id", id)
	return sealed, nil
}

// auditReplay is the middleware's replay hook: one idempotency_replay audit
// row per replay, never a second order_placed. It runs before the replay is
// sent; it cannot stop the replay, so a failure is logged.
func (s *server) auditReplay(ctx context.Context, ev idempotency.ReplayEvent) error {
	// The middleware bounds ctx by the store timeout and detaches it from
	// the client. An error refuses the replay on the fail-closed order route
	// (the client retries the same key), so every replayed order is audited.
	uid, _ := strconv.ParseInt(ev.Scope, 10, 64)
	err := s.data.audit(ctx, uid, "idempotency_replay", map[string]any{
		"endpoint":        ev.Endpoint,
		"request_hash":    ev.RequestHash,
		"original_status": ev.OriginalStatus,
	})
	if err != nil {
		return fmt.Errorf("audit: record a replay for user %d: %w", uid, err)
	}
	return nil
}

// newOrdersGate answers 503 new_orders_disabled while MBT_NEW_ORDERS_DISABLED
// is on, before the idempotency middleware sees the request.
func (s *server) newOrdersGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if truthy(s.cfg.getenv(envNewOrdersDisable)) {
			writeError(w, http.StatusServiceUnavailable, "new_orders_disabled")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeJSON sends v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal_error"}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeError sends {"error": code}.
func writeError(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, map[string]string{"error": code})
}

// dbError answers a failed database call: the example's own data is
// unavailable, so 503 with Retry-After.
func (s *server) dbError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("database call failed", "method", r.Method, "path", r.URL.Path, "error", err)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "database_unavailable")
}

// jsonMuxErrors makes the ServeMux's own 404 and 405 answers JSON. Only
// requests that match no pattern are intercepted.
func jsonMuxErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&muxErrorWriter{ResponseWriter: w}, r)
	})
}

// muxErrorWriter replaces the plain-text body of a 404 or 405 with JSON.
type muxErrorWriter struct {
	http.ResponseWriter
	replaced bool
}

func (m *muxErrorWriter) WriteHeader(code int) {
	var errCode string
	switch code {
	case http.StatusNotFound:
		errCode = "not_found"
	case http.StatusMethodNotAllowed:
		errCode = "method_not_allowed"
	default:
		m.ResponseWriter.WriteHeader(code)
		return
	}
	m.replaced = true
	m.Header().Del("X-Content-Type-Options")
	writeError(m.ResponseWriter, code, errCode)
}

func (m *muxErrorWriter) Write(p []byte) (int, error) {
	if m.replaced {
		return len(p), nil // the mux's plain-text body, already replaced
	}
	return m.ResponseWriter.Write(p)
}

// accessLog logs one line per request: method, path, status and duration.
// Never bodies, headers or keys.
func (s *server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		s.log.Info("request", "method", r.Method, "path", r.URL.Path,
			"status", cmp.Or(sw.status, http.StatusOK), "duration_ms", time.Since(start).Milliseconds())
	})
}

// statusWriter remembers the status code. Unwrap lets
// http.ResponseController (read deadlines, flushes) reach the connection.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errNotFound is returned by repo lookups that find nothing for the user.
var errNotFound = errors.New("not found")
