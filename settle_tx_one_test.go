package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The one-transaction flow of DESIGN.md "Transactional routes: one
// transaction": the claim lives in the handler's transaction, so what a
// duplicate meets depends on how the owner's transaction ends.

// appName tags a fixture's connections, so waitLockWaiter finds only its
// own backends among those of tests running in parallel.
func appName() (string, testdb.Option) {
	name := "tx-" + uuid.NewString()[:8]
	return name, testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = name })
}

// waitLockWaiter returns once a backend of application app waits on a lock
// held by another (a duplicate's claim waiting for the owner's row).
func waitLockWaiter(t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND cardinality(pg_blocking_pids(pid)) > 0`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the duplicate never waited on the owner's row")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blockedOwner makes the fixture's first execution wait in its handler,
// after its order was written, until release is closed, and answer status
// (0: the ordinary 201).
func blockedOwner(f *txFixture, status int) (in chan struct{}, release chan struct{}) {
	in, release = make(chan struct{}), make(chan struct{})
	f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n != 1 {
			return false
		}
		close(in)
		<-release
		if status == 0 {
			return false
		}
		w.WriteHeader(status)
		return true
	}
	return in, release
}

// TestTxDuplicateWhileOwnerMidHandler: a duplicate of a key whose owner is
// mid-handler waits at most the lock wait, then gets 409 in flight (its
// request hash not compared: the owner's is not visible yet), well within
// the wait plus the store timeout; the handler never runs for it. One
// arriving just after the owner committed gets the replay.
func TestTxDuplicateWhileOwnerMidHandler(t *testing.T) {
	t.Parallel()
	const storeTimeout = time.Second
	f, h := newTxFixture(t, idempotency.Config{StoreTimeout: storeTimeout, Lease: 10 * time.Second}, idempotency.RouteConfig{})
	in, release := blockedOwner(f, 0)
	key := uuid.NewString()
	owner := make(chan *httptest.ResponseRecorder)
	go func() { owner <- do(h, key, `{}`) }()
	<-in
	for _, body := range []string{`{}`, `{"other":"body"}`} {
		start := time.Now()
		w := do(h, key, body)
		took := time.Since(start)
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_in_flight") || w.Header().Get("Retry-After") != "5" {
			t.Fatalf("duplicate (%s) mid-handler: %d %v %s, want 409 in flight", body, w.Code, w.Header(), w.Body)
		}
		if bound := 5 * (idempotency.DefaultTxLockWait + storeTimeout); took > bound {
			t.Errorf("duplicate took %v, want within %v", took, bound)
		}
	}
	if n := gathered(t, f.reg, "idempotency_conflicts_total", "orders", "in_flight"); n != 2 {
		t.Errorf("in_flight conflicts = %v, want 2", n)
	}
	// Contention, never a store error.
	if n := gathered(t, f.reg, "idempotency_store_errors_total", "begin", idempotency.ReasonConflict); n != 0 {
		t.Errorf("begin store errors (conflict) = %v, want 0", n)
	}
	close(release)
	first := <-owner
	if first.Code != http.StatusCreated {
		t.Fatalf("owner: %d %s", first.Code, first.Body)
	}
	w := do(h, key, `{}`)
	if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" || !isReplayOf(w.Body.String(), first.Body.String()) {
		t.Fatalf("duplicate just after the commit: %d %s, want the replay of %s", w.Code, w.Body, first.Body)
	}
	if f.calls.Load() != 1 || f.orders(t) != 1 {
		t.Fatalf("executions %d, orders %d; want 1 and 1", f.calls.Load(), f.orders(t))
	}
}

// TestTxDuplicateWaitingForOwner: a duplicate that waits on the owner's
// row (a long lock wait here) answers from how the owner's transaction
// ended: its commit -> the replay; a failure recorded in the same
// transaction -> 409 previous_failed, and the handler never runs again; a
// 429 or a failure under ReleaseOnError rolls everything back, so the
// duplicate's claim wins and it executes.
func TestTxDuplicateWaitingForOwner(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		owner     int // the owner's status; 0: 201
		rc        idempotency.RouteConfig
		wantCode  int
		wantBody  string
		wantCalls int64
		orders    int
	}{
		{"owner commits", 0, idempotency.RouteConfig{}, 201, `"idempotency_replayed":true`, 1, 1},
		{"owner fails", 500, idempotency.RouteConfig{}, 409, "idempotency_previous_failed", 1, 0},
		{"owner declines with 429", 429, idempotency.RouteConfig{}, 201, `"execution":2`, 2, 1},
		{"owner fails under ReleaseOnError", 503, idempotency.RouteConfig{ReleaseOnError: true}, 201, `"execution":2`, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			app, tag := appName()
			c.rc.TxLockWait = 3 * time.Second // long, under the store timeout over the claim's tries
			f, h := newTxFixture(t, raceConfig, c.rc, tag)
			in, release := blockedOwner(f, c.owner)
			key := uuid.NewString()
			owner := make(chan *httptest.ResponseRecorder)
			go func() { owner <- do(h, key, `{}`) }()
			<-in
			dup := make(chan *httptest.ResponseRecorder)
			go func() { dup <- do(h, key, `{}`) }()
			waitLockWaiter(t, f.pool, app)
			close(release)
			<-owner
			w := <-dup
			if w.Code != c.wantCode || !strings.Contains(w.Body.String(), c.wantBody) {
				t.Fatalf("waiting duplicate: %d %s, want %d with %s", w.Code, w.Body, c.wantCode, c.wantBody)
			}
			if f.calls.Load() != c.wantCalls || f.orders(t) != c.orders {
				t.Fatalf("executions %d, orders %d; want %d and %d", f.calls.Load(), f.orders(t), c.wantCalls, c.orders)
			}
		})
	}
}

// TestTxRestartsOnSerializationFailure: at REPEATABLE READ a claim that
// waited for the owner's row fails with 40001 when the owner commits; the
// claim rolls back and begins again (the handler has not run), and answers
// with the replay.
func TestTxRestartsOnSerializationFailure(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			app, tag := appName()
			iso := testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_isolation"] = level })
			f, h := newTxFixture(t, raceConfig, idempotency.RouteConfig{TxLockWait: 3 * time.Second}, tag, iso)
			in, release := blockedOwner(f, 0)
			key := uuid.NewString()
			owner := make(chan *httptest.ResponseRecorder)
			go func() { owner <- do(h, key, `{}`) }()
			<-in
			dup := make(chan *httptest.ResponseRecorder)
			go func() { dup <- do(h, key, `{}`) }()
			waitLockWaiter(t, f.pool, app)
			close(release)
			first := <-owner
			w := <-dup
			if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" || !isReplayOf(w.Body.String(), first.Body.String()) {
				t.Fatalf("duplicate at %s: %d %s, want the replay of %d %s", level, w.Code, w.Body, first.Code, first.Body)
			}
			if f.calls.Load() != 1 || f.orders(t) != 1 {
				t.Fatalf("executions %d, orders %d; want 1 and 1", f.calls.Load(), f.orders(t))
			}
		})
	}
}

// TestTxTableLockIsAnOutage: a claim whose lock wait runs out on a
// table-level lock (DDL, a migration) is an outage, 503, not contention:
// the error's context names no tuple.
func TestTxTableLockIsAnOutage(t *testing.T) {
	t.Parallel()
	// One connection, warmed up by a first request: the claim's statements
	// are prepared already, so the claim itself meets the lock, under its
	// bounded wait.
	f, h := newTxFixture(t, idempotency.Config{StoreTimeout: 2 * time.Second}, idempotency.RouteConfig{}, testdb.MaxConns(1))
	if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
		t.Fatalf("warm-up: %d %s", w.Code, w.Body)
	}
	ctx := t.Context()
	locker, err := pgx.ConnectConfig(ctx, f.pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	w := do(h, uuid.NewString(), `{}`)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("claim behind a table lock: %d %s, want 503", w.Code, w.Body)
	}
	if n := gathered(t, f.reg, "idempotency_store_errors_total", "begin", idempotency.ReasonTimeout); n != 1 {
		t.Errorf("begin timeouts = %v, want 1", n)
	}
	if f.calls.Load() != 1 {
		t.Fatal("the handler ran behind the lock")
	}
}

// TestTxStatementPastDeadline: a handler statement still running at the
// handler's deadline is cancelled by pgx, which closes the connection: the
// transaction rolls back, the claim with it; the client gets 503, and the
// retry executes once (after 409s in flight while the server has not yet
// noticed the closed connection).
func TestTxStatementPastDeadline(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout = 1500 * time.Millisecond, 500 * time.Millisecond
	f, h := newTxFixture(t, idempotency.Config{Lease: lease, StoreTimeout: storeTimeout}, idempotency.RouteConfig{TTL: time.Minute})
	var stmtErr atomic.Pointer[error]
	f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n != 1 {
			return false
		}
		tx, _ := idempotency.TxFromContext(r.Context())
		_, err := tx.Exec(r.Context(), `SELECT pg_sleep(30)`)
		stmtErr.Store(&err)
		w.WriteHeader(http.StatusGatewayTimeout)
		return true
	}
	key := uuid.NewString()
	start := time.Now()
	w := do(h, key, `{}`)
	if took := time.Since(start); took > 5*lease {
		t.Fatalf("took %v, want about the handler's deadline (%v)", took, lease-storeTimeout)
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("answer %d %s, want 503", w.Code, w.Body)
	}
	if p := stmtErr.Load(); p == nil || *p == nil {
		t.Fatal("the statement was not cancelled")
	}
	// The server ends the cancelled statement's session when it notices
	// the closed connection (at the latest when statement_timeout, set
	// from the lease, stops the statement): until then the key is in
	// flight.
	deadline := time.Now().Add(5 * lease)
	for {
		w = do(h, key, `{}`)
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_in_flight") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("retry: %d %s, want a fresh 201", w.Code, w.Body)
	}
	if w := do(h, key, `{}`); w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("second retry: %d %s, want the replay", w.Code, w.Body)
	}
	if f.calls.Load() != 2 || f.orders(t) != 1 {
		t.Fatalf("executions %d, orders %d; want 2 and 1", f.calls.Load(), f.orders(t))
	}
}

// commitCutter is a tracer that breaks the proxied connection when the
// route's COMMIT starts (alone, or in the batch that carries the record):
// before it is sent (cut), or after the server has it, losing its reply
// (drop).
type commitCutter struct {
	proxy *tcpproxy.Proxy
	drop  bool
	armed atomic.Bool
}

func (c *commitCutter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") && c.armed.CompareAndSwap(true, false) {
		if c.drop {
			c.proxy.DropReplies()
		} else {
			c.proxy.Cut()
		}
	}
	return ctx
}

func (c *commitCutter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *commitCutter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		c.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: q.SQL})
	}
	return ctx
}

func (c *commitCutter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *commitCutter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestTxFailedCommit: a COMMIT that fails, or whose reply is lost, after
// the record was written answers 503 store unavailable although the
// handler ran; the row decides: the retry executes when the COMMIT never
// arrived, and replays when it committed.
func TestTxFailedCommit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		drop      bool
		wantCalls int64
	}{
		{"not committed", false, 2},
		{"committed, reply lost", true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			server, err := pgxpool.ParseConfig(testdb.ServerURL(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy := tcpproxy.New(t, net.JoinHostPort(server.ConnConfig.Host, strconv.Itoa(int(server.ConnConfig.Port))))
			cutter := &commitCutter{proxy: proxy, drop: c.drop}
			host, port, _ := net.SplitHostPort(proxy.Addr())
			p, _ := strconv.ParseUint(port, 10, 16)
			via := testdb.Configure(func(cfg *pgxpool.Config) {
				cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
				cfg.ConnConfig.Tracer = cutter
				cfg.MaxConns = 1
			})
			f, h := newTxFixture(t, idempotency.Config{StoreTimeout: 2 * time.Second, Lease: 10 * time.Second}, idempotency.RouteConfig{}, via)
			// Warm the one connection up, as every connection of a running
			// server is: its statements prepared, the batch that carries
			// the record and the COMMIT goes out in one piece.
			if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
				t.Fatalf("warm-up: %d %s", w.Code, w.Body)
			}
			f.calls.Store(0)
			if _, err := f.pool.Exec(context.Background(), `DELETE FROM orders`); err != nil {
				t.Fatal(err)
			}
			key := uuid.NewString()
			cutter.armed.Store(true)
			w := do(h, key, `{}`)
			if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "idempotency_store_unavailable") {
				t.Fatalf("answer %d %s, want 503 store unavailable", w.Code, w.Body)
			}
			if w.Header().Get("Location") != "" {
				t.Errorf("the handler's headers went out with the 503: %v", w.Header())
			}
			proxy.Restore()
			w = do(h, key, `{}`)
			replayed := w.Header().Get(idempotency.HeaderReplayed) == "true"
			if w.Code != http.StatusCreated || replayed != (c.wantCalls == 1) {
				t.Fatalf("retry: %d %s (replayed %v)", w.Code, w.Body, replayed)
			}
			if f.calls.Load() != c.wantCalls || f.orders(t) != 1 {
				t.Fatalf("executions %d, orders %d; want %d and 1", f.calls.Load(), f.orders(t), c.wantCalls)
			}
		})
	}
}

// TestTxResponseOnlyAfterCommit: nothing of a transactional response
// reaches the client before the COMMIT, a Flush included (it is a no-op
// until then): while the handler, after writing and flushing, still runs,
// the client has received nothing.
func TestTxResponseOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, raceConfig, idempotency.RouteConfig{})
	flushed, release := make(chan struct{}), make(chan struct{})
	f.behave = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"partial":true}`))
		if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Flush: %v", err)
		}
		close(flushed)
		<-release
		return true
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	got := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set(idempotency.HeaderKey, uuid.NewString())
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	<-flushed
	select {
	case err := <-got:
		t.Fatalf("the client got its answer (%v) before the handler returned and the COMMIT", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestTxRefusedAfterHandler: a handler that keeps its transaction, or a
// savepoint of it, past its return is refused with pgx.ErrTxClosed: the
// COMMIT went pipelined with the record, so pgx still counts the
// transaction open, and its connection is back in the pool serving other
// requests.
func TestTxRefusedAfterHandler(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1))
	kept := make(chan [2]pgx.Tx, 1)
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		sp, err := tx.Begin(r.Context())
		if err != nil {
			t.Error(err)
			return false
		}
		if err := sp.Commit(r.Context()); err != nil { // a savepoint is the handler's own
			t.Error(err)
		}
		kept <- [2]pgx.Tx{tx, sp}
		return false
	}
	if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
		t.Fatalf("answer %d %s", w.Code, w.Body)
	}
	txs := <-kept
	f.behave = nil
	ctx := context.Background()
	for i, tx := range txs {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (idem_key, execution) VALUES ('late', 0)`); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("tx %d: Exec after the handler returned: %v, want ErrTxClosed", i, err)
		}
		rows, err := tx.Query(ctx, `SELECT 1`)
		if !errors.Is(err, pgx.ErrTxClosed) || !errors.Is(rows.Err(), pgx.ErrTxClosed) {
			t.Errorf("tx %d: Query after the handler returned: %v / %v, want ErrTxClosed", i, err, rows.Err())
		}
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("tx %d: QueryRow after the handler returned: %v, want ErrTxClosed", i, err)
		}
		if err := tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: `SELECT 1`}}}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("tx %d: SendBatch after the handler returned: %v, want ErrTxClosed", i, err)
		}
		if _, err := tx.Begin(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("tx %d: Begin after the handler returned: %v, want ErrTxClosed", i, err)
		}
	}
	// The one connection serves the next request, and nothing of the late
	// statements reached it.
	if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
		t.Fatalf("next request: %d %s", w.Code, w.Body)
	}
	if n := f.orders(t); n != 2 {
		t.Fatalf("orders %d, want 2", n)
	}
}

// TestTxHandlerSettings: the claim's lock wait bounds the claim only. The
// handler's statements keep the session's lock_timeout, and run under the
// server-side bounds of a vanished owner, statement_timeout and
// idle_in_transaction_session_timeout, both the lease.
func TestTxHandlerSettings(t *testing.T) {
	t.Parallel()
	session := testdb.Configure(func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["lock_timeout"] = "7s" })
	f, h := newTxFixture(t, idempotency.Config{Lease: 12 * time.Second}, idempotency.RouteConfig{TxLockWait: 25 * time.Millisecond}, session)
	got := make(chan [3]string, 2)
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		var s [3]string
		if err := tx.QueryRow(r.Context(), `SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
			current_setting('idle_in_transaction_session_timeout')`).Scan(&s[0], &s[1], &s[2]); err != nil {
			t.Error(err)
		}
		got <- s
		return false
	}
	if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
		t.Fatalf("answer %d %s", w.Code, w.Body)
	}
	if s, want := <-got, [3]string{"7s", "12s", "12s"}; s != want {
		t.Fatalf("the handler's lock_timeout, statement_timeout, idle_in_transaction_session_timeout: %q, want %q", s, want)
	}
	// The settings were the transaction's own: the connection is back to
	// the session's.
	var lockTimeout, statementTimeout string
	if err := f.pool.QueryRow(context.Background(), `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).Scan(&lockTimeout, &statementTimeout); err != nil {
		t.Fatal(err)
	}
	if lockTimeout != "7s" || statementTimeout != "0" {
		t.Fatalf("after the route: lock_timeout %q, statement_timeout %q; want 7s and 0", lockTimeout, statementTimeout)
	}
}

// TestTxQueryExecModes: the transactional route's batches (BEGIN with the
// claim, the record with COMMIT) work in every pgx query mode, the ones
// PgBouncer's transaction mode needs included: a miss, its replay, and a
// failed handler whose key is recorded failed in the same transaction.
func TestTxQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{},
				testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
			failing := uuid.NewString()
			f.behave = func(_ int64, w http.ResponseWriter, r *http.Request) bool {
				if key, _ := idempotency.KeyFromContext(r.Context()); key == failing {
					w.WriteHeader(http.StatusInternalServerError)
					return true
				}
				return false
			}
			key := uuid.NewString()
			if w := do(h, key, `{}`); w.Code != http.StatusCreated {
				t.Fatalf("miss: %d %s", w.Code, w.Body)
			}
			if w := do(h, key, `{}`); w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "true" {
				t.Fatalf("replay: %d %s %v", w.Code, w.Body, w.Header())
			}
			if w := do(h, failing, `{}`); w.Code != http.StatusInternalServerError {
				t.Fatalf("failing handler: %d %s", w.Code, w.Body)
			}
			if w := do(h, failing, `{}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_previous_failed") {
				t.Fatalf("retry of the failed key: %d %s", w.Code, w.Body)
			}
			if n := f.orders(t); n != 1 || f.calls.Load() != 2 {
				t.Fatalf("orders %d, executions %d; want 1 and 2", n, f.calls.Load())
			}
			if n := f.pool.Stat().AcquiredConns(); n != 0 {
				t.Fatalf("%d connections still held", n)
			}
		})
	}
}

// TestTxTakeoverOfExpiredKey: a key whose row expired (its TTL ran out,
// cleanup has not deleted it yet) is taken over inside the route's
// transaction: the retry executes, and the next one replays its answer.
func TestTxTakeoverOfExpiredKey(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{})
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if _, err := f.pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	execution := func(w *httptest.ResponseRecorder) int {
		var b struct{ Execution int }
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		return b.Execution
	}
	w := do(h, key, `{}`)
	if w.Code != http.StatusCreated || w.Header().Get(idempotency.HeaderReplayed) != "" || execution(w) != 2 {
		t.Fatalf("after expiry: %d %s %v, want the second execution", w.Code, w.Body, w.Header())
	}
	if w := do(h, key, `{}`); w.Header().Get(idempotency.HeaderReplayed) != "true" || execution(w) != 2 {
		t.Fatalf("then: %d %s, want the second execution replayed", w.Code, w.Body)
	}
	if n := f.orders(t); n != 2 || f.calls.Load() != 2 {
		t.Fatalf("orders %d, executions %d; want 2 and 2", n, f.calls.Load())
	}
}
