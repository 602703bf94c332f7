package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// childDB is a migrated schema with the children's tables, and a pool on it.
func childDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	// connect_timeout: NewPostgresStore warns about a pool without one;
	// pool_max_conns: the storm's hundreds of concurrent claims per process
	// would otherwise queue for pgxpool's default of 4 past the store
	// timeout (saturation, Unavailable) on a loaded machine.
	dsn := testdb.NewDSN(t) + "&connect_timeout=5&pool_max_conns=16"
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), childDDL); err != nil {
		t.Fatal(err)
	}
	return dsn, pool
}

// dbCount counts the rows of query.
func dbCount(t *testing.T, pool *pgxpool.Pool, query string, args ...any) (n int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStormAcrossProcesses: 32 concurrent duplicates of each of many keys,
// spread over two server processes sharing one database and over the
// Connect, gRPC and gRPC-Web protocols with both codecs, execute exactly
// once per key; every duplicate gets the first answer or Aborted in
// flight (after retrying Unavailable, which a saturated pool on a loaded
// machine answers), never another answer.
func TestStormAcrossProcesses(t *testing.T) {
	t.Parallel()
	dsn, pool := childDB(t)
	hc := h2cClient()
	servers := []string{startChild(t, dsn, false).Addr, startChild(t, dsn, false).Addr}
	const keys, dups = 24, 32
	var wg sync.WaitGroup
	var unavailable atomic.Int64
	answers := make([][dups]*structpb.Struct, keys)
	errs := make(chan error, keys*dups)
	for k := range keys {
		key := uuid.NewString()
		for d := range dups {
			w := allWires[d%len(allWires)]
			c := dialProc(hc, servers[d%2], svc+"Transfer", w)
			wg.Go(func() {
				resp, err := call(t.Context(), c, key, map[string]any{"amount": 10, "to": key})
				for attempt := 0; connect.CodeOf(err) == connect.CodeUnavailable && attempt < 10; attempt++ {
					// Saturation on a loaded machine: retry the same key, as the answer invites.
					unavailable.Add(1)
					time.Sleep(100 * time.Millisecond)
					resp, err = call(t.Context(), c, key, map[string]any{"amount": 10, "to": key})
				}
				switch {
				case err == nil:
					answers[k][d] = resp.Msg
				case connect.CodeOf(err) != connect.CodeAborted:
					errs <- fmt.Errorf("key %d over %s: %v", k, w.name, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wrong := dbCount(t, pool, `SELECT count(*) FROM (SELECT key FROM executions GROUP BY key HAVING count(*) <> 1) x`)
	total := dbCount(t, pool, `SELECT count(DISTINCT key) FROM executions`)
	if wrong != 0 || total != keys {
		t.Fatalf("%d keys executed, %d of them not exactly once; want %d, each once", total, wrong, keys)
	}
	for k := range answers {
		var first *structpb.Struct
		for _, a := range answers[k] {
			if a != nil && first == nil {
				first = a
			} else if a != nil && !proto.Equal(a, first) {
				t.Fatalf("key %d: answers %v and %v differ", k, first, a)
			}
		}
		if first == nil {
			t.Errorf("key %d: no duplicate got an answer", k)
		}
	}
	t.Logf("%d keys x %d duplicates over 2 processes and %d protocol/codec pairs; executions from %d processes; %d Unavailable answers retried",
		keys, dups, len(allWires), dbCount(t, pool, `SELECT count(DISTINCT pid) FROM executions`), unavailable.Load())
}

// TestCrashMidMethod: a server process is killed (SIGKILL) while a
// transactional method runs, after its write, on each protocol; the
// immediate retry on another server executes at once, the next one
// replays, and the method's effect exists once.
func TestCrashMidMethod(t *testing.T) {
	t.Parallel()
	dsn, pool := childDB(t)
	hc := h2cClient()
	doomed, survivor := startChild(t, dsn, true), startChild(t, dsn, false)
	keys := map[string]wire{}
	lost := make(chan error, len(wires))
	for _, w := range wires {
		key := uuid.NewString()
		keys[key] = w
		c := dialProc(hc, doomed.Addr, svc+"Settle", w)
		go func() { _, err := call(t.Context(), c, key, map[string]any{"settle": 10}); lost <- err }()
	}
	for range wires { // the barrier: each call wrote its ledger row in its open transaction
		line := doomed.Next(t, 30*time.Second)
		if _, ok := keys[strings.TrimPrefix(line, "STARTED ")]; !ok {
			t.Fatalf("doomed server: %q", line)
		}
	}
	if err := doomed.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range wires {
		if err := <-lost; connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("a call to the killed server: %v; want Unavailable", err)
		}
	}
	for key, w := range keys {
		c := dialProc(hc, survivor.Addr, svc+"Settle", w)
		resp, err := call(t.Context(), c, key, map[string]any{"settle": 10})
		if err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" {
			t.Fatalf("%s: the immediate retry: %v; want it executed", w.name, err)
		}
		again, err := call(t.Context(), c, key, map[string]any{"settle": 10})
		if err != nil || !proto.Equal(resp.Msg, again.Msg) || again.Header().Get(idemconnect.ReplayedHeader) != "true" {
			t.Fatalf("%s: the second retry: %v %v; want the replay of %v", w.name, again, err, resp.Msg)
		}
		if n := dbCount(t, pool, `SELECT count(*) FROM ledger WHERE key = $1`, key); n != 1 {
			t.Fatalf("%s: %d ledger rows, want 1", w.name, n)
		}
	}
}

// TestTransactional: on each protocol, a transactional method's write
// commits with the key's record; a failing one's rolls back (the key
// fails all the same); an answer over the buffer rolls back and is
// Internal IDEMPOTENCY_RESPONSE_TOO_LARGE.
func TestTransactional(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw := pgMiddleware(t, pool, idempotency.Config{})
	settle := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		tx, ok := idempotency.TxFromContext(ctx)
		if !ok {
			return nil, connect.NewError(connect.CodeInternal, errors.New("no transaction"))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, req.Header().Get(idemconnect.KeyHeader)); err != nil {
			return nil, err
		}
		if err := asked(req); err != nil {
			return nil, err
		}
		return reply(req, "1"), nil
	}
	tx := idempotency.RouteConfig{Transactional: true, MaxResponseBytes: 64}
	base := serveProcs(t, mw, map[string]idemconnect.Method{svc + "Settle": {RequireKey: true, Route: tx}},
		map[string]procFunc{svc + "Settle": settle})
	rows := func(key string) int { return dbCount(t, pool, `SELECT count(*) FROM ledger WHERE key = $1`, key) }
	for _, w := range wires {
		t.Run(w.name, func(t *testing.T) {
			c := dialProc(h2cClient(), base, svc+"Settle", w)
			ok := uuid.NewString()
			first, err := call(t.Context(), c, ok, map[string]any{"settle": 10})
			if err != nil || rows(ok) != 1 || dbCount(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1
				AND status = 'completed' AND scope_endpoint = 'connect:/idem.test.Payments/Settle' AND response_code = 200
				AND convert_from(response_headers, 'UTF8')::jsonb ? ':rpc'`, ok) != 1 {
				t.Fatalf("completed: %v; %d ledger rows, want 1 beside the key completed as connect:/...Settle, 200, :rpc", err, rows(ok))
			}
			again, err := call(t.Context(), c, ok, map[string]any{"settle": 10})
			if err != nil || !proto.Equal(first.Msg, again.Msg) || again.Header().Get(idemconnect.ReplayedHeader) != "true" || rows(ok) != 1 {
				t.Fatalf("retry: %v %v; want the replay, one ledger row", again, err)
			}
			failed := uuid.NewString()
			fields := map[string]any{"settle": 10, "code": float64(connect.CodeInternal)}
			if _, err := call(t.Context(), c, failed, fields); connect.CodeOf(err) != connect.CodeInternal || rows(failed) != 0 {
				t.Fatalf("failing: %v with %d ledger rows; want Internal and its write rolled back", err, rows(failed))
			}
			_, err = call(t.Context(), c, failed, fields)
			wantAnswer(t, "after a failure", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED", 0)
			big := uuid.NewString()
			_, err = call(t.Context(), c, big, map[string]any{"settle": strings.Repeat("x", 1024)})
			wantAnswer(t, "over the buffer", err, connect.CodeInternal, "IDEMPOTENCY_RESPONSE_TOO_LARGE", 0)
			if rows(big) != 0 {
				t.Fatalf("%d ledger rows after an answer over the buffer, want 0", rows(big))
			}
		})
	}
}

// proxiedPool is a pool on a new migrated schema whose connections go
// through a proxy the test can cut.
func proxiedPool(t *testing.T, opts ...testdb.Option) (*pgxpool.Pool, *tcpproxy.Proxy) {
	t.Helper()
	var proxy *tcpproxy.Proxy
	pool := testdb.New(t, append(opts, testdb.Configure(func(c *pgxpool.Config) {
		proxy = tcpproxy.New(t, fmt.Sprintf("%s:%d", c.ConnConfig.Host, c.ConnConfig.Port))
		host, port, _ := strings.Cut(proxy.Addr(), ":")
		c.ConnConfig.Host = host
		fmt.Sscan(port, &c.ConnConfig.Port)
		c.ConnConfig.Fallbacks = nil
		c.ConnConfig.ConnectTimeout = time.Second
	}))...)
	return pool, proxy
}

// counter counts executions by key.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

// note counts one execution of key and returns its number.
func (c *counter) note(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return fmt.Sprint(c.n[key])
}

func (c *counter) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// counted is a procedure that counts its run under the call's key and
// answers.
func counted(c *counter) procFunc {
	return func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return reply(req, c.note(req.Header().Get(idemconnect.KeyHeader))), nil
	}
}

// TestStoreCut: with the store's connection cut, on each protocol, a
// fail-closed method answers Unavailable IDEMPOTENCY_STORE_UNAVAILABLE
// with a RetryInfo and does not run; a fail-open one runs without
// deduplication (an outage is the class that allows a bypass); once the
// link is back, the fail-closed retry executes.
func TestStoreCut(t *testing.T) {
	t.Parallel()
	pool, proxy := proxiedPool(t)
	mw := pgMiddleware(t, pool, idempotency.Config{StoreTimeout: 500 * time.Millisecond})
	r := &counter{}
	base := serveProcs(t, mw, map[string]idemconnect.Method{
		svc + "Closed": {},
		svc + "Open":   {Route: idempotency.RouteConfig{FailOpen: true}},
	}, map[string]procFunc{svc + "Closed": counted(r), svc + "Open": counted(r)})
	hc := h2cClient()
	if _, err := call(t.Context(), dialProc(hc, base, svc+"Closed", wires[0]), uuid.NewString(), map[string]any{"a": 1}); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	proxy.Cut()
	closed := map[string]string{}
	for _, w := range wires {
		key, open := uuid.NewString(), uuid.NewString()
		closed[w.name] = key
		_, err := call(t.Context(), dialProc(hc, base, svc+"Closed", w), key, map[string]any{"a": 1})
		wantAnswer(t, w.name+": fail-closed, store cut", err, connect.CodeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
		if r.count(key) != 0 {
			t.Fatalf("%s: a fail-closed method ran with its store cut", w.name)
		}
		resp, err := call(t.Context(), dialProc(hc, base, svc+"Open", w), open, map[string]any{"a": 1})
		if err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" || r.count(open) != 1 {
			t.Fatalf("%s: fail-open, store cut: %v after %d runs; want a bypass", w.name, err, r.count(open))
		}
	}
	proxy.Restore()
	for _, w := range wires {
		key := closed[w.name]
		if _, err := call(t.Context(), dialProc(hc, base, svc+"Closed", w), key, map[string]any{"a": 1}); err != nil || r.count(key) != 1 {
			t.Fatalf("%s: after the cut: %v after %d runs; want the retry to execute", w.name, err, r.count(key))
		}
	}
}

// TestClientDeadline: on each protocol, a client whose deadline is
// shorter than the method gets DeadlineExceeded; the method runs on,
// detached from the client's cancellation, and the client's retry with
// the key gets its replay.
func TestClientDeadline(t *testing.T) {
	t.Parallel()
	recorded := make(chan struct{}, 1)
	mw := pgMiddleware(t, testdb.New(t), idempotency.Config{
		Observer: func(_ context.Context, o idempotency.Observation) {
			if o.Outcome == idempotency.OutcomeExecuted {
				recorded <- struct{}{}
			}
		}})
	r := &counter{}
	var release chan struct{}
	started := make(chan struct{}, 1)
	slow := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		run := r.note(req.Header().Get(idemconnect.KeyHeader))
		started <- struct{}{}
		<-release
		if ctx.Err() != nil {
			return nil, connect.NewError(connect.CodeOf(ctx.Err()), ctx.Err())
		}
		return reply(req, run), nil
	}
	base := serveProcs(t, mw, map[string]idemconnect.Method{svc + "Slow": {}}, map[string]procFunc{svc + "Slow": slow})
	for _, w := range wires {
		release = make(chan struct{})
		c := dialProc(h2cClient(), base, svc+"Slow", w)
		key := uuid.NewString()
		// The deadline leaves the request time to reach the handler on a
		// loaded machine; the handler outlasts it, since it waits for the
		// release that follows the client's DeadlineExceeded.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		if _, err := call(ctx, c, key, map[string]any{"a": 1}); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			t.Fatalf("%s: %v; want DeadlineExceeded", w.name, err)
		}
		cancel()
		wait := func(ch chan struct{}, what string) {
			select { // an upper bound proving the wait never hangs, not a speed check
			case <-ch:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the method never %s", w.name, what)
			}
		}
		wait(started, "started")
		close(release)
		wait(recorded, "recorded its answer")
		resp, err := call(t.Context(), c, key, map[string]any{"a": 1})
		if err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "true" || resp.Msg.GetFields()["run"].GetStringValue() != "1" || r.count(key) != 1 {
			t.Fatalf("%s: retry: %v %v after %d runs; want the replay of the first run", w.name, resp, err, r.count(key))
		}
	}
}
