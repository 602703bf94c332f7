package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The reconcile tests: a handler that ends Unsettled leaves its key in
// flight with its lease ended, and the retry reconciles it through the
// route's hook, on a memory store and on PostgreSQL.

// venueRoute is an order route whose handler ends Unsettled while
// unsettled is set (the venue's answer was lost) and answers 201
// otherwise; runs counts its runs.
type venueRoute struct {
	h         http.Handler
	runs      atomic.Int64
	unsettled atomic.Bool
}

// newVenueRoute wraps the venue handler under rc on mw.
func newVenueRoute(mw *idempotency.Middleware, rc idempotency.RouteConfig) *venueRoute {
	v := &venueRoute{}
	v.unsettled.Store(true)
	v.h = mw.MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.runs.Add(1)
		if v.unsettled.Load() {
			idempotency.Unsettled(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":"from the handler"}`)
	}))
	return v
}

// reconcileCfg is the middleware configuration of these tests: a store
// timeout a loaded machine meets, and a lease that leaves a hook's
// deadline room below it.
var reconcileCfg = idempotency.Config{Lease: 10 * time.Second, StoreTimeout: 2 * time.Second}

// found is a hook's done answer: the venue's order.
var found = idempotency.Response{Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"order":"from the venue"}`)}

// TestReconcileDoneRecordsAndReplays: a key left Unsettled is reconciled
// by its retry: the hook's order is recorded and answered as a replay,
// and a second retry replays it without asking the hook again.
func TestReconcileDoneRecordsAndReplays(t *testing.T) {
	forStores(t, func(t *testing.T, store idempotency.Store) {
		var asked atomic.Int64
		var info idempotency.ReconcileInfo
		v := newVenueRoute(newMiddleware(t, store, reconcileCfg), idempotency.RouteConfig{Name: "orders",
			Reconcile: func(ctx context.Context, i idempotency.ReconcileInfo) (any, error) {
				asked.Add(1)
				info = i
				if k, ok := idempotency.KeyFromContext(ctx); !ok || k != i.Key {
					return nil, fmt.Errorf("the hook's context has key %q", k)
				}
				return found, nil
			}})
		key := uuid.NewString()
		w := do(v.h, key, `{"qty":1}`)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("unsettled: %d Retry-After %q %s, want 503 with Retry-After 1", w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		assertCode(t, w, "idempotency_store_unavailable")
		for i := range 2 {
			w = do(v.h, key, `{"qty":1}`)
			if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" ||
				w.Body.String() != `{"idempotency_replayed":true,"order":"from the venue"}` {
				t.Fatalf("retry %d: %d %q %s, want the venue's order replayed", i+1, w.Code, w.Header().Get(idempotency.HeaderReplayed), w.Body)
			}
		}
		if asked.Load() != 1 || v.runs.Load() != 1 {
			t.Fatalf("hook asked %d times, handler ran %d times; want 1 and 1", asked.Load(), v.runs.Load())
		}
		if info.Key != key || info.Endpoint != "orders" || info.Attempt != 2 || info.RequestHash == "" || info.ClaimedAt.IsZero() {
			t.Fatalf("the hook got %+v", info)
		}
	})
}

// TestReconcileNotDoneRunsHandlerOnce: a hook that finds no trace lets the
// retry run the handler under the reconcile claim, once; later retries
// replay its answer.
func TestReconcileNotDoneRunsHandlerOnce(t *testing.T) {
	forStores(t, func(t *testing.T, store idempotency.Store) {
		var asked atomic.Int64
		v := newVenueRoute(newMiddleware(t, store, reconcileCfg), idempotency.RouteConfig{Name: "orders",
			Reconcile: func(context.Context, idempotency.ReconcileInfo) (any, error) {
				asked.Add(1)
				return nil, fmt.Errorf("venue: %w", idempotency.ErrNotDone)
			}})
		key := uuid.NewString()
		if w := do(v.h, key, `{}`); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("unsettled: %d, want 503", w.Code)
		}
		v.unsettled.Store(false)
		w := do(v.h, key, `{}`)
		if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" {
			t.Fatalf("not done: %d replayed %q, want the handler's fresh 201", w.Code, w.Header().Get(idempotency.HeaderReplayed))
		}
		w = do(v.h, key, `{}`)
		if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("after not done: %d replayed %q, want a replay", w.Code, w.Header().Get(idempotency.HeaderReplayed))
		}
		if asked.Load() != 1 || v.runs.Load() != 2 {
			t.Fatalf("hook asked %d times, handler ran %d times; want 1 and 2 (unsettled, then not done)", asked.Load(), v.runs.Load())
		}
	})
}

// TestReconcileUnknownAnswersOutcomeUnknown: a hook that errs, answers
// unknown or hangs past its deadline leaves the key for a later
// reconcile: 409 outcome_unknown within the deadline, and the next retry
// asks again at once (the reconcile claim's lease was ended).
func TestReconcileUnknownAnswersOutcomeUnknown(t *testing.T) {
	const wait = 200 * time.Millisecond
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	for name, hook := range map[string]func(context.Context) (any, error){
		"error":   func(context.Context) (any, error) { return nil, errors.New("venue: 502") },
		"unknown": func(context.Context) (any, error) { return nil, idempotency.ErrOutcomeUnknown },
		"hang":    func(context.Context) (any, error) { <-hang; return found, nil }, // ignores its context
		"refused": func(context.Context) (any, error) { return "not a Response", nil },
	} {
		t.Run(name, func(t *testing.T) {
			forStores(t, func(t *testing.T, store idempotency.Store) {
				var asked atomic.Int64
				v := newVenueRoute(newMiddleware(t, store, reconcileCfg), idempotency.RouteConfig{Name: "orders", ReconcileTimeout: wait,
					Reconcile: func(ctx context.Context, _ idempotency.ReconcileInfo) (any, error) { asked.Add(1); return hook(ctx) }})
				key := uuid.NewString()
				do(v.h, key, `{}`)
				for i := range 2 {
					start := time.Now()
					w := do(v.h, key, `{}`)
					assertCode(t, w, "idempotency_outcome_unknown")
					if took := time.Since(start); w.Code != http.StatusConflict || took > 5*wait+reconcileCfg.StoreTimeout*5 {
						t.Fatalf("retry %d: %d after %v, want 409 within the hook's deadline", i+1, w.Code, took)
					}
				}
				if asked.Load() != 2 || v.runs.Load() != 1 {
					t.Fatalf("hook asked %d times, handler ran %d; want 2 and 1", asked.Load(), v.runs.Load())
				}
			})
		})
	}
}

// TestUnsettledWithoutHook: without a hook the retry of an Unsettled key
// answers 409 outcome_unknown at once, not in flight for a lease.
func TestUnsettledWithoutHook(t *testing.T) {
	forStores(t, func(t *testing.T, store idempotency.Store) {
		v := newVenueRoute(newMiddleware(t, store, reconcileCfg), idempotency.RouteConfig{Name: "orders"})
		key := uuid.NewString()
		if w := do(v.h, key, `{}`); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("unsettled: %d, want 503 with Retry-After 1", w.Code)
		}
		assertCode(t, do(v.h, key, `{}`), "idempotency_outcome_unknown")
		if v.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", v.runs.Load())
		}
	})
}

// TestDoUnsettled: a Do function whose error wraps ErrUnsettled gets a 503
// answer matching ErrUnsettled and ErrStoreUnavailable and unwrapping to
// its error; the retry reconciles to the hook's value, replayed.
func TestDoUnsettled(t *testing.T) {
	forStores(t, func(t *testing.T, store idempotency.Store) {
		mw := newMiddleware(t, store, reconcileCfg)
		op, err := mw.Operation("settle", idempotency.RouteConfig{Scoped: true,
			Reconcile: func(context.Context, idempotency.ReconcileInfo) (any, error) { return 42, nil }})
		if err != nil {
			t.Fatal(err)
		}
		venue := errors.New("venue: timeout")
		c := idempotency.Call{Key: uuid.NewString(), Scope: "u1", Request: []byte(`{}`)}
		_, _, err = idempotency.Do(t.Context(), op, c, func(context.Context) (int, error) {
			return 0, fmt.Errorf("%w: %w", venue, idempotency.ErrUnsettled)
		})
		var ea *idempotency.ErrorAnswer
		if !errors.Is(err, idempotency.ErrUnsettled) || !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, venue) ||
			!errors.As(err, &ea) || ea.Status != http.StatusServiceUnavailable {
			t.Fatalf("Do: %v, want a 503 *ErrorAnswer matching ErrUnsettled, ErrStoreUnavailable and the function's error", err)
		}
		v, info, err := idempotency.Do(t.Context(), op, c, func(context.Context) (int, error) { return 0, errors.New("ran again") })
		if err != nil || v != 42 || !info.Replayed {
			t.Fatalf("retry: %v %v %+v, want the hook's 42 replayed", v, err, info)
		}
	})
}

// TestReconcileOneAtATime: many requests on two middlewares (two pools)
// race one stale key while the hook holds its reconcile claim: exactly
// one of them runs the hook, the others get 409 in flight, and every
// later retry replays.
func TestReconcileOneAtATime(t *testing.T) {
	dsn := testdb.NewDSN(t)
	var stores []idempotency.Store
	for range 2 {
		pool, err := pgxpool.New(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		stores = append(stores, idempotency.NewPostgresStore(pool))
	}
	var (
		active, most atomic.Int64
		perAttempt   sync.Map // attempt -> *atomic.Int64
		entered      = make(chan struct{}, 1)
		release      = make(chan struct{})
	)
	hook := func(_ context.Context, i idempotency.ReconcileInfo) (any, error) {
		n, _ := perAttempt.LoadOrStore(i.Attempt, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if a := active.Add(1); a > most.Load() {
			most.Store(a)
		}
		entered <- struct{}{}
		<-release
		active.Add(-1)
		return found, nil
	}
	rc := idempotency.RouteConfig{Name: "orders", Reconcile: hook, ReconcileTimeout: 2 * time.Second}
	cfg := reconcileCfg
	var routes []*venueRoute
	for _, s := range stores {
		routes = append(routes, newVenueRoute(newMiddleware(t, s, cfg), rc))
	}
	key := uuid.NewString()
	if w := do(routes[0].h, key, `{}`); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("unsettled: %d, want 503", w.Code)
	}
	const n = 16
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes <- do(routes[i%2].h, key, `{}`).Code })
	}
	<-entered // one request holds the reconcile claim, in the hook
	for range n - 1 {
		if c := <-codes; c != http.StatusConflict {
			t.Errorf("a racing request got %d, want 409 in flight", c)
		}
	}
	close(release)
	wg.Wait()
	if c := <-codes; c != http.StatusCreated {
		t.Errorf("the reconciler got %d, want 201", c)
	}
	if most.Load() != 1 {
		t.Errorf("%d hooks ran at once, want 1", most.Load())
	}
	perAttempt.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() != 1 {
			t.Errorf("attempt %v: %d hook calls, want 1", k, v.(*atomic.Int64).Load())
		}
		return true
	})
	for _, r := range routes {
		if w := do(r.h, key, `{}`); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Errorf("after: %d, want a replay", w.Code)
		}
	}
}

// assertCode fails unless w's body is the contract's answer code.
func assertCode(t *testing.T, w *httptest.ResponseRecorder, code string) {
	t.Helper()
	if got := strings.TrimSpace(w.Body.String()); got != `{"error":"`+code+`"}` {
		t.Fatalf("%d %s, want the answer %s", w.Code, got, code)
	}
}

// TestUnsettledTransactionalRollsBack: on a transactional route Unsettled
// rolls the whole transaction back, the claim and the handler's writes:
// 503, nothing written, and the retry runs the handler again.
func TestUnsettledTransactionalRollsBack(t *testing.T) {
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE venue_orders (key text)`); err != nil {
		t.Fatal(err)
	}
	mw := newMiddleware(t, idempotency.NewPostgresStore(pool), reconcileCfg)
	var unsettled atomic.Bool
	unsettled.Store(true)
	var runs atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, _ := idempotency.TxFromContext(r.Context())
		key, _ := idempotency.KeyFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO venue_orders VALUES ($1)`, key); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if unsettled.Load() {
			idempotency.Unsettled(w, r)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	rows := func(key string) (n int) {
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM venue_orders WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || rows(key) != 0 {
		t.Fatalf("unsettled: %d, %d rows; want 503 with Retry-After 1 and nothing written", w.Code, rows(key))
	}
	unsettled.Store(false)
	if w := do(h, key, `{}`); w.Code != http.StatusCreated || rows(key) != 1 || runs.Load() != 2 {
		t.Fatalf("retry: %d, %d rows, %d runs; want the handler run again and its write committed", w.Code, rows(key), runs.Load())
	}
}

// TestReconcileConfig: construction refuses a ReconcileTimeout not below
// the lease less the store timeout, a negative one, one without a hook,
// and a hook on a NoStore route; ReconcileStale refuses a limit below 1
// and a RouteConfig without a hook, changing nothing.
func TestReconcileConfig(t *testing.T) {
	mw := newMiddleware(t, idempotency.NewMemoryStore(), reconcileCfg) // lease 10s, store timeout 2s
	hook := func(context.Context, idempotency.ReconcileInfo) (any, error) { return nil, idempotency.ErrNotDone }
	for name, rc := range map[string]idempotency.RouteConfig{
		"timeout at lease less store timeout": {Reconcile: hook, ReconcileTimeout: 8 * time.Second},
		"negative timeout":                    {Reconcile: hook, ReconcileTimeout: -time.Second},
		"timeout without a hook":              {ReconcileTimeout: time.Second},
		"NoStore":                             {Reconcile: hook, NoStore: true},
	} {
		if _, err := mw.Route(rc); err == nil {
			t.Errorf("%s: the route was built", name)
		}
	}
	if _, err := mw.Route(idempotency.RouteConfig{Reconcile: hook, ReconcileTimeout: 7900 * time.Millisecond}); err != nil {
		t.Errorf("a timeout below the lease less the store timeout was refused: %v", err)
	}
	if _, _, _, err := mw.ReconcileStale(t.Context(), "orders", idempotency.RouteConfig{}, 10); err == nil {
		t.Error("ReconcileStale without a hook was accepted")
	}
	if _, _, _, err := mw.ReconcileStale(t.Context(), "orders", idempotency.RouteConfig{Reconcile: hook}, 0); err == nil {
		t.Error("ReconcileStale with a limit of 0 was accepted")
	}
}

// TestReconcileLoggedAndObserved: every reconcile logs its outcome (INFO
// for done, WARN with the error for unknown) and counts in
// idempotency_reconcile_duration_seconds by endpoint and outcome.
func TestReconcileLoggedAndObserved(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	cfg := reconcileCfg
	cfg.Registerer, cfg.Logger = reg, slog.New(slog.NewJSONHandler(&logs, nil))
	answer := error(nil)
	v := newVenueRoute(newMiddleware(t, idempotency.NewMemoryStore(), cfg), idempotency.RouteConfig{Name: "orders",
		Reconcile: func(context.Context, idempotency.ReconcileInfo) (any, error) { return found, answer }})
	done, unknown := uuid.NewString(), uuid.NewString()
	do(v.h, done, `{}`)
	do(v.h, done, `{}`)
	answer = errors.New("venue: 502")
	do(v.h, unknown, `{}`)
	do(v.h, unknown, `{}`)
	for _, want := range []string{`"level":"INFO","msg":"idempotency: reconciled a stale key"`, `"outcome":"done"`,
		`"level":"WARN","msg":"idempotency: reconciled a stale key"`, `"outcome":"unknown"`, `"error":"venue: 502"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %s in the log:\n%s", want, logs.String())
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() == "idempotency_reconcile_duration_seconds" {
			for _, m := range f.GetMetric() {
				counts[m.GetLabel()[0].GetValue()+"/"+m.GetLabel()[1].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	if counts["orders/done"] != 1 || counts["orders/unknown"] != 1 {
		t.Errorf("reconcile metric %v, want one done and one unknown for orders", counts)
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
