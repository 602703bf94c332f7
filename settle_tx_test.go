package idempotency_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// txFixture is a transactional order route over a fresh schema with an
// orders table the handler writes through the route's transaction.
type txFixture struct {
	pool  *pgxpool.Pool
	reg   *prometheus.Registry
	calls atomic.Int64
	// behave decides each execution's answer; nil writes an order and
	// answers 201.
	behave func(n int64, w http.ResponseWriter, r *http.Request) bool
}

func newTxFixture(t *testing.T, cfg idempotency.Config, rc idempotency.RouteConfig, opts ...testdb.Option) (*txFixture, http.Handler) {
	t.Helper()
	f := &txFixture{pool: testdb.New(t, append([]testdb.Option{testdb.MaxConns(16)}, opts...)...), reg: prometheus.NewRegistry()}
	if _, err := f.pool.Exec(context.Background(),
		`CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL, execution BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return f, f.route(t, f.pool, cfg, rc)
}

// route is the fixture's order route over a store on pool.
func (f *txFixture) route(t *testing.T, pool *pgxpool.Pool, cfg idempotency.Config, rc idempotency.RouteConfig) http.Handler {
	t.Helper()
	cfg.Registerer, cfg.Logger = f.reg, cmp.Or(cfg.Logger, quiet)
	cfg.Enabled = func(ctx context.Context) bool {
		r, _ := idempotency.RequestFromContext(ctx)
		return r.Header.Get("X-Disabled") == ""
	}
	mw := newMiddleware(t, idempotency.NewPostgresStore(pool), cfg)
	rc.Transactional = true
	rc.Name = "orders"
	return mw.MustRoute(rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.calls.Add(1)
		tx, ok := idempotency.TxFromContext(r.Context())
		if !ok {
			t.Error("no transaction in the handler's context")
			return
		}
		key, _ := idempotency.KeyFromContext(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (idem_key, execution) VALUES ($1, $2) RETURNING id`, key, n).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if f.behave != nil && f.behave(n, w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"execution":%d}`, id, n)
	}))
}

func (f *txFixture) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTxStorm: a storm of duplicates on a transactional route executes and
// commits exactly one order per key.
func TestTxStorm(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	cfg := raceConfig
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs)
		}
	})
	f, h := newTxFixture(t, cfg, idempotency.RouteConfig{})
	race(t, []http.Handler{h}, newKeys(20), 32)
	if f.calls.Load() != 20 || f.orders(t) != 20 {
		t.Fatalf("executions %d, orders %d, want 20 and 20", f.calls.Load(), f.orders(t))
	}
}

// TestTxCommitsWithRecord: the order and the record land together; the
// replay carries the committed order.
func TestTxCommitsWithRecord(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	key := uuid.NewString()
	first := do(h, key, `{"qty":1}`)
	second := do(h, key, `{"qty":1}`)
	if first.Code != 201 || second.Code != 201 || second.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("first %d, second %d %q", first.Code, second.Code, second.Header().Get(idempotency.HeaderReplayed))
	}
	if !isReplayOf(second.Body.String(), first.Body.String()) ||
		second.Header().Get("Location") != first.Header().Get("Location") {
		t.Fatalf("replay %s %q differs from %s %q", second.Body, second.Header().Get("Location"), first.Body, first.Header().Get("Location"))
	}
	if f.orders(t) != 1 {
		t.Fatalf("orders = %d", f.orders(t))
	}
}

// TestTxHandlerError: a 500 rolls the handler's writes back and marks the key
// failed; with ReleaseOnError the key is released and the retry executes
// exactly once. A 429 rolls back and releases.
func TestTxHandlerError(t *testing.T) {
	t.Parallel()
	failFirst := func(status int) func(n int64, w http.ResponseWriter, r *http.Request) bool {
		return func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				w.WriteHeader(status)
				return true
			}
			return false
		}
	}
	for _, c := range []struct {
		name        string
		rc          idempotency.RouteConfig
		status      int
		wantRetry   int
		wantOrders  int
		wantExecute int64
	}{
		{"500 fails the key", idempotency.RouteConfig{}, 500, 409, 0, 1},
		{"500 with ReleaseOnError releases it", idempotency.RouteConfig{ReleaseOnError: true}, 500, 201, 1, 2},
		{"429 releases it", idempotency.RouteConfig{}, 429, 201, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{}, c.rc)
			f.behave = failFirst(c.status)
			key := uuid.NewString()
			if w := do(h, key, `{}`); w.Code != c.status {
				t.Fatalf("first: %d", w.Code)
			}
			if f.orders(t) != 0 {
				t.Fatal("the failed attempt's order was committed")
			}
			w := do(h, key, `{}`)
			if w.Code != c.wantRetry {
				t.Fatalf("retry: %d %s", w.Code, w.Body)
			}
			if c.wantRetry == 409 && !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
				t.Fatalf("retry body %s", w.Body)
			}
			do(h, key, `{}`) // a third attempt never executes again
			if f.orders(t) != c.wantOrders || f.calls.Load() != c.wantExecute {
				t.Fatalf("orders %d executions %d, want %d and %d", f.orders(t), f.calls.Load(), c.wantOrders, c.wantExecute)
			}
		})
	}
}

// TestTxPanicRollsBack: a panic rolls back, fails the key and is re-raised.
func TestTxPanicRollsBack(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	f.behave = func(int64, http.ResponseWriter, *http.Request) bool { panic("fill engine exploded") }
	key := uuid.NewString()
	func() {
		defer func() {
			if p := recover(); p != "fill engine exploded" {
				t.Fatalf("recovered %v", p)
			}
		}()
		do(h, key, `{}`)
	}()
	if w := do(h, key, `{}`); w.Code != 409 || f.orders(t) != 0 {
		t.Fatalf("after panic: %d, orders %d", w.Code, f.orders(t))
	}
}

// TestTxPanicOnClosedConnection: a handler that panics after its
// connection was closed (pgx closes it when a statement outlives its
// deadline) gives the connection back to the pool, keyed or not: a leaked
// one would starve every route and hang pool.Close at shutdown.
func TestTxPanicOnClosedConnection(t *testing.T) {
	t.Parallel()
	for _, key := range []string{uuid.NewString(), ""} {
		f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
		f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
			tx, _ := idempotency.TxFromContext(r.Context())
			_ = tx.Conn().PgConn().Close(r.Context())
			panic("statement failed on a closed connection")
		}
		before := f.pool.Stat().AcquiredConns()
		func() {
			defer func() { _ = recover() }()
			do(h, key, `{}`)
		}()
		// A dead connection given back is destroyed in the background:
		// wait, bounded, for the pool to see it gone.
		deadline := time.Now().Add(10 * time.Second)
		for f.pool.Stat().AcquiredConns() != before && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling: the pool offers no signal for it
		}
		if after := f.pool.Stat().AcquiredConns(); after != before {
			t.Fatalf("key %q: connections held %d before, %d 10 s after the panic; want it given back", key, before, after)
		}
	}
}

// TestTxPassThrough: without a key, and with the kill-switch off, the
// handler still gets a transaction, which commits.
func TestTxPassThrough(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	if w := do(h, "", `{}`); w.Code != 201 {
		t.Fatalf("no key: %d %s", w.Code, w.Body)
	}
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, "not-a-uuid")
	r.Header.Set("X-Disabled", "1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 201 || f.orders(t) != 2 {
		t.Fatalf("kill-switch off: %d, orders %d", w.Code, f.orders(t))
	}
}

// TestTxBlockedOwnerHeldUntilServerBound: an owner blocked in Go (it
// ignores its deadline) keeps its transaction, and so its key: duplicates
// get 409 in flight, each within the lock wait plus the store timeout,
// until the server-side bound (idle_in_transaction_session_timeout, set
// locally from the lease) ends the owner's session. The claim then rolls
// back with everything else, one duplicate executes, and the owner's
// client, once its handler returns, gets 503: exactly one order commits.
func TestTxBlockedOwnerHeldUntilServerBound(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout = 1500 * time.Millisecond, 500 * time.Millisecond
	f, h := newTxFixture(t, idempotency.Config{Lease: lease, StoreTimeout: storeTimeout},
		idempotency.RouteConfig{TTL: time.Minute})
	ownerWaiting := make(chan struct{})
	releaseOwner := make(chan struct{})
	f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			close(ownerWaiting)
			<-releaseOwner // ignores its deadline: a stuck owner
		}
		return false
	}
	key := uuid.NewString()
	ownerDone := make(chan *httptest.ResponseRecorder)
	go func() { ownerDone <- do(h, key, `{}`) }()
	<-ownerWaiting
	var (
		executed string
		inFlight int
	)
	deadline := time.Now().Add(20 * lease)
	for {
		start := time.Now()
		w := do(h, key, `{}`)
		if took := time.Since(start); took > 5*(idempotency.DefaultTxLockWait+storeTimeout) {
			t.Fatalf("a duplicate took %v, want about the lock wait (never hangs)", took)
		}
		if w.Code == 201 {
			executed = w.Body.String()
			break
		}
		if w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
			t.Fatalf("duplicate while the owner holds the key: %d %s", w.Code, w.Body)
		}
		inFlight++
		if time.Now().After(deadline) {
			t.Fatal("the server never ended the blocked owner's session")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if inFlight == 0 {
		t.Error("no duplicate met the blocked owner's key in flight")
	}
	close(releaseOwner)
	owner := <-ownerDone
	if owner.Code != http.StatusServiceUnavailable {
		t.Fatalf("blocked owner got %d %s, want 503 (its session ended, its claim rolled back)", owner.Code, owner.Body)
	}
	if f.orders(t) != 1 || f.calls.Load() != 2 {
		t.Fatalf("orders %d executions %d, want 1 committed of 2", f.orders(t), f.calls.Load())
	}
	if w := do(h, key, `{}`); w.Header().Get(idempotency.HeaderReplayed) != "true" || !isReplayOf(w.Body.String(), executed) {
		t.Fatalf("retry: %d %s, want the replay of %s", w.Code, w.Body, executed)
	}
}

// isReplayOf reports whether replay is the JSON object original plus
// "idempotency_replayed": true (Postgres may change white space and order).
func isReplayOf(replay, original string) bool {
	var r, o map[string]any
	if json.Unmarshal([]byte(replay), &r) != nil || json.Unmarshal([]byte(original), &o) != nil || r["idempotency_replayed"] != true {
		return false
	}
	delete(r, "idempotency_replayed")
	return reflect.DeepEqual(r, o)
}

// TestTxEscapedJSONBody: a JSON body with \u escapes, which JSONB might
// refuse inside the route's transaction, is kept raw and still replays as
// JSON with the replay field.
func TestTxEscapedJSONBody(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	f.behave = func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"note":"caf\u00e9 \u0000 \ud800"}`)
		return true
	}
	key := uuid.NewString()
	first := do(h, key, `{}`)
	second := do(h, key, `{}`)
	if first.Code != 201 || second.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("first %d %s, second %d %s", first.Code, first.Body, second.Code, second.Body)
	}
	if second.Body.String() != `{"idempotency_replayed":true,"note":"caf\u00e9 \u0000 \ud800"}` {
		t.Fatalf("replay %s", second.Body)
	}
	if f.orders(t) != 1 {
		t.Fatalf("orders %d", f.orders(t))
	}
}

// TestTxHandlerCannotCommit: a handler that commits or rolls back the
// route's transaction itself is refused, so its writes still commit only
// together with the record, and the key replays.
func TestTxHandlerCannotCommit(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	var commitErr, rollbackErr error
	f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		commitErr = tx.Commit(r.Context())
		rollbackErr = tx.Rollback(r.Context())
		return false
	}
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if !errors.Is(commitErr, idempotency.ErrTxManaged) || !errors.Is(rollbackErr, idempotency.ErrTxManaged) {
		t.Fatalf("Commit %v, Rollback %v: want ErrTxManaged", commitErr, rollbackErr)
	}
	if w := do(h, key, `{}`); w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if f.orders(t) != 1 || f.calls.Load() != 1 {
		t.Fatalf("orders %d executions %d", f.orders(t), f.calls.Load())
	}
}

// TestTxInvalidUTF8JSON: a JSON-typed body with invalid UTF-8 (which JSONB
// refuses) is stored raw, so the commit succeeds and the key replays.
func TestTxInvalidUTF8JSON(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	f.behave = func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("{\"name\":\"caf\xe9\"}"))
		return true
	}
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := do(h, key, `{}`)
	if w.Header().Get(idempotency.HeaderReplayed) != "true" || w.Body.String() != "{\"name\":\"caf\xe9\"}" {
		t.Fatalf("retry: %d %q", w.Code, w.Body)
	}
	if f.orders(t) != 1 || f.calls.Load() != 1 {
		t.Fatalf("orders %d executions %d", f.orders(t), f.calls.Load())
	}
}

// hugeNumbersJSON is valid JSON that a JSONB column refuses (1e400000 is
// beyond numeric's range), with a long number literal too.
var hugeNumbersJSON = `{"qty":1e400000,"price":` + strings.Repeat("9", 300) + `}`

// TestTxUnrepresentableJSONNumber: a JSON body that the ADR's JSONB column
// would refuse for its numbers is stored as its bytes, like any body, so
// the commit succeeds and the key replays it.
func TestTxUnrepresentableJSONNumber(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	f.behave = func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, hugeNumbersJSON)
		return true
	}
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 || w.Body.String() != hugeNumbersJSON {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := do(h, key, `{}`)
	want := `{"idempotency_replayed":true,` + strings.TrimPrefix(hugeNumbersJSON, "{")
	if w.Header().Get(idempotency.HeaderReplayed) != "true" || w.Body.String() != want {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if f.orders(t) != 1 || f.calls.Load() != 1 {
		t.Fatalf("orders %d executions %d", f.orders(t), f.calls.Load())
	}
}

// TestTxNoTimeLeftForTheHandler: when waiting for a pooled connection
// leaves the handler no time (its deadline, lease less store timeout, has
// passed), the handler is not run: the transaction rolls back, the key is
// released, the client gets 503, and its retry runs once. The connections
// come back once the handler's deadline has passed, reckoned from the
// claim's own store deadline, and the claim then has seconds left.
func TestTxNoTimeLeftForTheHandler(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout = 5 * time.Second, 4 * time.Second
	watch := &acquireWatch{deadline: make(chan time.Time, 1)}
	pool := testdb.New(t, testdb.MaxConns(4), testdb.Tracer(watch))
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{Lease: lease, StoreTimeout: storeTimeout,
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, _ := idempotency.TxFromContext(r.Context())
		key, _ := idempotency.KeyFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO orders (idem_key) VALUES ($1)`, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	// Hold every connection, so the claim waits for one.
	var held []*pgxpool.Conn
	releaseHeld := sync.OnceFunc(func() {
		for _, c := range held {
			c.Release()
		}
	})
	t.Cleanup(releaseHeld) // before the pool's own cleanup, which waits for them
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	key := uuid.NewString()
	answered := make(chan *httptest.ResponseRecorder)
	watch.armed.Store(true)
	go func() { answered <- do(h, key, `{}`) }()
	// The claim waits for a connection under its store deadline, which
	// began after the claim did: the handler's deadline is at most
	// lease - 2*storeTimeout from it.
	var claimDeadline time.Time
	select {
	case claimDeadline = <-watch.deadline:
	case <-time.After(10 * lease):
		t.Fatal("the claim never asked the pool for a connection")
	}
	if claimDeadline.IsZero() {
		t.Fatal("the claim waits for a pooled connection without a deadline")
	}
	handlerDeadline := claimDeadline.Add(lease - 2*storeTimeout)
	time.Sleep(time.Until(handlerDeadline) + 10*time.Millisecond) // until that deadline has passed
	releaseHeld()
	var w *httptest.ResponseRecorder
	select {
	case w = <-answered:
	case <-time.After(10 * lease):
		t.Fatal("no answer")
	}
	if w.Code != http.StatusServiceUnavailable || calls.Load() != 0 {
		t.Fatalf("first: %d %s, %d executions; want 503 and none", w.Code, w.Body, calls.Load())
	}
	var orders int
	if w := do(h, key, `{}`); w.Code != 201 || calls.Load() != 1 {
		t.Fatalf("retry: %d %s, %d executions", w.Code, w.Body, calls.Load())
	}
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("%d orders (%v), want 1", orders, err)
	}
}

// acquireWatch is a pool tracer that reports the deadline of the first
// connection request made once armed (the middleware's; the test's own
// come before), the zero time when it has none.
type acquireWatch struct {
	armed    atomic.Bool
	once     sync.Once
	deadline chan time.Time
}

func (a *acquireWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (a *acquireWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (a *acquireWatch) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if a.armed.Load() {
		d, _ := ctx.Deadline()
		a.once.Do(func() { a.deadline <- d })
	}
	return ctx
}
func (a *acquireWatch) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {}

// TestTxNeverRerunsAnOrdinaryClaim: a stale key claimed by a route that
// was not transactional (an old instance mid rolling deploy, or another
// route of the same name) is never run again: its owner's effects did not
// roll back. The transactional route answers outcome unknown.
func TestTxNeverRerunsAnOrdinaryClaim(t *testing.T) {
	t.Parallel()
	const lease = 1500 * time.Millisecond
	cfg := idempotency.Config{Lease: lease, StoreTimeout: 500 * time.Millisecond}
	f, txRoute := newTxFixture(t, cfg, idempotency.RouteConfig{TTL: time.Minute})
	started, release := make(chan struct{}), make(chan struct{})
	key := uuid.NewString()
	// The ordinary route claims the key and its handler outlives the lease.
	stuck := make(chan struct{})
	cfg.Registerer, cfg.Logger, cfg.Enabled = prometheus.NewRegistry(), quiet, func(context.Context) bool { return true }
	mw, err := idempotency.New(idempotency.NewPostgresStore(f.pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ordinary := mw.MustRoute(idempotency.RouteConfig{Name: "orders", TTL: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release // a stuck owner
		w.WriteHeader(http.StatusCreated)
	}))
	go func() { do(ordinary, key, `{}`); close(stuck) }()
	<-started
	deadline := time.Now().Add(20 * lease)
	for {
		w := do(txRoute, key, `{}`)
		if strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
			break
		}
		if w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_in_flight") || time.Now().After(deadline) {
			t.Fatalf("transactional route on a stale ordinary claim: %d %s", w.Code, w.Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	<-stuck
	if f.calls.Load() != 0 || f.orders(t) != 0 {
		t.Fatalf("the transactional route executed a key an ordinary route owned: calls %d, orders %d", f.calls.Load(), f.orders(t))
	}
}

// logBuffer collects a logger's output for tests that check an event was
// logged.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// keyStatus reads a key's row status.
func (f *txFixture) keyStatus(t *testing.T, key string) string {
	t.Helper()
	var status string
	if err := f.pool.QueryRow(context.Background(), `SELECT status FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// emailTaken makes the fixture's handler insert an e-mail address that is
// already taken, catch the unique violation and answer 409 email_taken from
// the aborted transaction, as a sign-up handler would.
func emailTaken(t *testing.T, f *txFixture) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), `CREATE TABLE users (email TEXT PRIMARY KEY);
		INSERT INTO users VALUES ('taken@example.com')`); err != nil {
		t.Fatal(err)
	}
	f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		_, err := tx.Exec(r.Context(), `INSERT INTO users VALUES ('taken@example.com')`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Errorf("insert of a taken address: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":"email_taken"}`)
		return true
	}
}

// TestTxAbortedTransaction: a handler that catches a failed statement and
// answers 409 from the aborted transaction gets its answer sent and
// recorded (in the same transaction, after the rollback to the
// savepoint): its writes rolled back, the retry replays the 409 and never
// runs the handler again. It used to get 503 and leave the key in flight.
func TestTxAbortedTransaction(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	emailTaken(t, f)
	key := uuid.NewString()
	first := do(h, key, `{}`)
	if first.Code != http.StatusConflict || first.Body.String() != `{"error":"email_taken"}` {
		t.Fatalf("first: %d %s, want the handler's 409 email_taken", first.Code, first.Body)
	}
	if st := f.keyStatus(t, key); st != "completed" {
		t.Fatalf("key status %q, want completed", st)
	}
	retry := do(h, key, `{}`)
	if retry.Code != http.StatusConflict || retry.Header().Get(idempotency.HeaderReplayed) != "true" ||
		!isReplayOf(retry.Body.String(), first.Body.String()) {
		t.Fatalf("retry: %d %s, want the replay of the 409", retry.Code, retry.Body)
	}
	if f.calls.Load() != 1 || f.orders(t) != 0 {
		t.Fatalf("executions %d, orders %d; want 1 and none (the aborted transaction's insert rolled back)", f.calls.Load(), f.orders(t))
	}
}

// TestTxPassThroughAbortedTransaction: without a key, a handler answering
// 409 from an aborted transaction gets its answer sent (its writes rolled
// back), not a 503 claiming the store failed.
func TestTxPassThroughAbortedTransaction(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	emailTaken(t, f)
	if w := do(h, "", `{}`); w.Code != http.StatusConflict || w.Body.String() != `{"error":"email_taken"}` {
		t.Fatalf("no key: %d %s, want the handler's 409 email_taken", w.Code, w.Body)
	}
	if f.orders(t) != 0 {
		t.Fatalf("orders %d, want none", f.orders(t))
	}
}

// TestTxAnswersKeepOuterHeaders: when the middleware answers instead of the
// handler (409 previous_failed after a deferred constraint's violation was
// recorded failed; 503 after a failed commit without a key), it drops only
// the headers the handler set, not those outer middleware set before (CORS,
// request id).
func TestTxAnswersKeepOuterHeaders(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		key  bool
		want int
	}{
		{"deferred constraint", true, 409},
		{"failed commit without a key", false, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
			if _, err := f.pool.Exec(context.Background(),
				`CREATE TABLE deferred (id INT, CONSTRAINT deferred_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
				t.Fatal(err)
			}
			f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				// Violates a deferred constraint: the record's SET
				// CONSTRAINTS ALL IMMEDIATE fails, or, without a key, the
				// COMMIT.
				if _, err := tx.Exec(r.Context(), `INSERT INTO deferred VALUES (1), (1)`); err != nil {
					t.Error(err)
				}
				w.Header().Set("X-Handler", "1")
				return false
			}
			outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Access-Control-Allow-Origin", "https://app.example")
				w.Header().Set("X-Request-Id", "req-1")
				h.ServeHTTP(w, r)
			})
			key := ""
			if c.key {
				key = uuid.NewString()
			}
			w := do(outer, key, `{}`)
			if w.Code != c.want {
				t.Fatalf("answer %d %s, want %d", w.Code, w.Body, c.want)
			}
			hdr := w.Header()
			if hdr.Get("Access-Control-Allow-Origin") != "https://app.example" || hdr.Get("X-Request-Id") != "req-1" {
				t.Errorf("outer middleware's headers lost: %v", hdr)
			}
			if hdr.Get("X-Handler") != "" || hdr.Get("Location") != "" {
				t.Errorf("the handler's headers went out with the middleware's answer: %v", hdr)
			}
			if f.orders(t) != 0 {
				t.Errorf("orders %d, want none", f.orders(t))
			}
		})
	}
}

// TestTxResponseOverBufferCap: a transactional response over four times
// MaxResponseBytes is not buffered on: the handler's writes roll back, the
// key is failed, the client gets 500 idempotency_response_too_large, and
// the metric counts it. A response between the limit and the cap is sent
// and recorded without its body, as on any route.
func TestTxResponseOverBufferCap(t *testing.T) {
	t.Parallel()
	const limit = 1024
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{MaxResponseBytes: limit})
	var writeErr atomic.Pointer[error]
	f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		size := 3 * limit // between the limit and the cap
		if r.Header.Get("X-Huge") != "" {
			size = 64 * limit
		}
		w.Header().Set("X-Handler", "1")
		chunk := bytes.Repeat([]byte("x"), 512)
		for written := 0; written < size; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				writeErr.Store(&err)
				break
			}
		}
		return true
	}
	huge := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
		if key != "" {
			r.Header.Set(idempotency.HeaderKey, key)
		}
		r.Header.Set("X-Huge", "1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	key := uuid.NewString()
	w := huge(key)
	if w.Code != 500 || w.Body.String() != `{"error":"idempotency_response_too_large"}` || w.Header().Get("X-Handler") != "" {
		t.Fatalf("over the cap: %d %v %.100s", w.Code, w.Header(), w.Body)
	}
	if writeErr.Load() == nil {
		t.Error("the handler's Write past the cap returned no error")
	}
	if st := f.keyStatus(t, key); st != "failed" {
		t.Fatalf("key status %q, want failed", st)
	}
	if w := huge(key); w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
		t.Fatalf("retry: %d %.100s", w.Code, w.Body)
	}
	if w := huge(""); w.Code != 500 || w.Body.String() != `{"error":"idempotency_response_too_large"}` {
		t.Fatalf("over the cap without a key: %d %.100s", w.Code, w.Body)
	}
	if f.orders(t) != 0 || f.calls.Load() != 2 {
		t.Fatalf("orders %d, executions %d; want none and 2", f.orders(t), f.calls.Load())
	}
	if n := gathered(t, f.reg, "idempotency_response_too_large_total", "orders"); n != 2 {
		t.Fatalf("idempotency_response_too_large_total = %v, want 2", n)
	}

	key = uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 200 || w.Body.Len() != 3*limit {
		t.Fatalf("under the cap: %d, %d bytes", w.Code, w.Body.Len())
	}
	if w := do(h, key, `{}`); w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_response_not_stored") {
		t.Fatalf("retry under the cap: %d %s", w.Code, w.Body)
	}
}

// TestTxUnavailableIsCounted: every 503 of a transactional route counts as
// a store_unavailable rejection, like the 503s of any other route: a
// COMMIT that fails (without a key) and a BEGIN that fails (with and
// without a key), and the failed call counts as a store error of its
// operation (commit, begin). A handler that violates a deferred constraint
// on a keyed request gets its key recorded failed (409 then and after),
// never a 503 whose retry would run the handler again.
func TestTxUnavailableIsCounted(t *testing.T) {
	t.Parallel()
	t.Run("commit", func(t *testing.T) {
		t.Parallel()
		f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
		for _, ddl := range []string{
			`CREATE TABLE accounts (id INT PRIMARY KEY)`,
			`CREATE TABLE postings (account INT REFERENCES accounts DEFERRABLE INITIALLY DEFERRED)`,
		} {
			if _, err := f.pool.Exec(t.Context(), ddl); err != nil {
				t.Fatal(err)
			}
		}
		f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
			// A posting to no account: the foreign key, checked at COMMIT,
			// fails it.
			tx, _ := idempotency.TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO postings VALUES (7)`); err != nil {
				t.Error(err)
			}
			return false
		}
		key := uuid.NewString()
		if w := do(h, key, `{}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
			t.Fatalf("keyed: %d %s, want 409 previous_failed (the violation recorded failed, never a 503)", w.Code, w.Body)
		}
		if w := do(h, "", `{}`); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("no key: %d %s, want 503 (its COMMIT failed)", w.Code, w.Body)
		}
		if n := gathered(t, f.reg, "idempotency_rejections_total", "orders", "store_unavailable"); n != 1 {
			t.Errorf("store_unavailable rejections = %v, want 1 (one per 503)", n)
		}
		// The foreign key's violation (23503) is no outage kind of its own.
		if n := gathered(t, f.reg, "idempotency_store_errors_total", "commit", idempotency.ReasonOther); n != 1 {
			t.Errorf("commit store errors = %v, want 1 (the failed commit)", n)
		}
		// The retry of the failed key never runs again, never gets a 503.
		if w := do(h, key, `{}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
			t.Fatalf("retry: %d %s, want 409 previous_failed", w.Code, w.Body)
		}
		if f.calls.Load() != 2 || f.orders(t) != 0 {
			t.Errorf("executions %d (keyed and unkeyed), orders %d; want 2 and 0", f.calls.Load(), f.orders(t))
		}
	})
	t.Run("begin", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		store := beginFails{idempotency.NewMemoryStore()}
		mw, err := idempotency.New(store, idempotency.Config{Registerer: reg, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		var calls int
		h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", Transactional: true})(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls++ }))
		key := uuid.NewString()
		for _, k := range []string{key, ""} {
			w := do(h, k, `{}`)
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("key %q: %d %v %s, want 503 with Retry-After: 1", k, w.Code, w.Header(), w.Body)
			}
		}
		if calls != 0 {
			t.Errorf("handler ran %d times without its transaction", calls)
		}
		if n := gathered(t, reg, "idempotency_rejections_total", "orders", "store_unavailable"); n != 2 {
			t.Errorf("store_unavailable rejections = %v, want 2 (one per 503)", n)
		}
		if n := gathered(t, reg, "idempotency_store_errors_total", "begin", idempotency.ReasonConnection); n != 2 {
			t.Errorf("begin store errors = %v, want 2", n)
		}
		// The claimed key was given back: nothing ran under it.
		if recs, err := store.ExportScope(context.Background(), ""); err != nil || len(recs) != 0 {
			t.Errorf("rows left: %v, %v; want none", recs, err)
		}
	})
}

// beginFails is a wrapped store that backs a transactional route but
// cannot begin a transaction.
type beginFails struct{ *idempotency.MemoryStore }

func (beginFails) BeginClaim(context.Context, *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.ClaimResult, error) {
	return nil, idempotency.ClaimResult{}, &idempotency.StoreError{Op: "begin", Reason: idempotency.ReasonConnection, Err: errors.New("connection refused")}
}

// TxLockWaitBudget is PostgreSQL's budget, as a PostgresStore's.
func (beginFails) TxLockWaitBudget(wait time.Duration) time.Duration {
	return (*idempotency.PostgresStore)(nil).TxLockWaitBudget(wait)
}
