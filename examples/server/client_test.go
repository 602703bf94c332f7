package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/idemclient"
	"github.com/idemkit/idempotency/internal/lossyproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The client package (idemclient) against the real example server, in
// process: the server behind a recorder of what it received and answered,
// behind a lossy proxy, with an idemclient.Transport in front.

// arrival is one order request as the server received and answered it.
type arrival struct {
	keys   []string
	body   string
	status int
	code   string
	at     time.Time // when the answer was written
}

// recorder wraps the server and records every order request.
type recorder struct {
	next http.Handler

	mu      sync.Mutex
	seen    []arrival
	changed chan struct{} // closed and replaced on every new arrival
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/api/trading/orders" {
		rec.next.ServeHTTP(w, r)
		return
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "recorder: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	sw := &answerWriter{ResponseWriter: w}
	rec.next.ServeHTTP(sw, r)
	a := arrival{keys: r.Header.Values("Idempotency-Key"), body: string(raw), status: sw.status, at: time.Now()}
	var b struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(sw.head.Bytes(), &b) == nil {
		a.code = b.Error
	}
	rec.mu.Lock()
	rec.seen = append(rec.seen, a)
	close(rec.changed)
	rec.changed = make(chan struct{})
	rec.mu.Unlock()
}

// wait returns the first recorded answer that match accepts, waiting up
// to waitLimit for it.
func (rec *recorder) wait(t *testing.T, match func(arrival) bool) arrival {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		rec.mu.Lock()
		for _, a := range rec.seen {
			if match(a) {
				rec.mu.Unlock()
				return a
			}
		}
		changed := rec.changed
		rec.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no matching answer within %v", waitLimit)
		}
	}
}

// byKey returns the recorded order requests that carried key.
func (rec *recorder) byKey(key string) []arrival {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []arrival
	for _, a := range rec.seen {
		if len(a.keys) == 1 && a.keys[0] == key {
			out = append(out, a)
		}
	}
	return out
}

// answerWriter remembers the status and the first bytes of the body.
type answerWriter struct {
	http.ResponseWriter
	status int
	head   bytes.Buffer
}

func (w *answerWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.head.Len() < 4096 {
		w.head.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clientEnv is a server behind a recorder and a lossy proxy, and a client
// whose transport is an idemclient.Transport through that proxy.
type clientEnv struct {
	*testEnv
	rec   *recorder
	proxy string // the proxy's base URL
	tr    *idemclient.Transport
	hc    *http.Client

	mu     sync.Mutex
	faults []lossyproxy.Fault // what the proxy does to the next order requests
}

// startClientEnv starts the server (in memory, or on a fresh Postgres
// schema when pg) as startEnv does, with the recorder and the proxy.
func startClientEnv(t *testing.T, o envOptions, pg bool) *clientEnv {
	t.Helper()
	var pool *pgxpool.Pool
	if pg {
		pool = testdb.New(t, o.poolOptions...)
	}
	vars := newEnvVars(o.vars)
	cfg := testConfig(o, vars)
	cfg.pool = pool
	srv, cleanup, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	rec := &recorder{next: srv, changed: make(chan struct{})}
	ts := httptest.NewServer(rec)
	t.Cleanup(func() {
		ts.Close()
		cleanup()
	})
	e := &clientEnv{testEnv: &testEnv{client: newClient(t, ts.URL), srv: srv, vars: vars, pool: pool}, rec: rec}

	target, _ := url.Parse(ts.URL)
	proxy := &lossyproxy.Proxy{Target: target, Plan: e.nextFault}
	t.Cleanup(proxy.Close)
	ps := httptest.NewServer(proxy)
	t.Cleanup(ps.Close)
	e.proxy = ps.URL

	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	e.tr = &idemclient.Transport{Base: base, MaxAttempts: 10, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	e.hc = &http.Client{Transport: e.tr, Timeout: waitLimit}
	return e
}

// setFaults makes the proxy apply fs to the next order requests, in order.
func (e *clientEnv) setFaults(fs ...lossyproxy.Fault) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.faults = fs
}

func (e *clientEnv) nextFault(_ int, r *http.Request) lossyproxy.Fault {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.URL.Path != "/api/trading/orders" || len(e.faults) == 0 {
		return lossyproxy.Pass
	}
	f := e.faults[0]
	e.faults = e.faults[1:]
	return f
}

// place posts an order body through the proxy with the idemclient
// transport, with ctx (which may carry a key).
func (e *clientEnv) place(ctx context.Context, tok string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", e.proxy+"/api/trading/orders", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	return e.hc.Do(req)
}

// mustPlace is place for the test's goroutine: it returns the answer with
// its body read.
func (e *clientEnv) mustPlace(t *testing.T, ctx context.Context, tok string, body io.Reader) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := e.place(ctx, tok, body)
	if err != nil {
		t.Fatalf("place order: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("answer %d %s: %v", resp.StatusCode, raw, err)
	}
	return resp, m
}

// onlyKey returns the one key the server saw on every order request, and
// checks that each carried exactly body.
func onlyKey(t *testing.T, seen []arrival, body string) string {
	t.Helper()
	key := ""
	for i, a := range seen {
		if len(a.keys) != 1 || (key != "" && a.keys[0] != key) || a.body != body {
			t.Fatalf("order request %d: keys %q, body %q; want one key (%q) and body %q", i+1, a.keys, a.body, key, body)
		}
		key = a.keys[0]
	}
	return key
}

const aaplBody = `{"symbol":"AAPL","side":"buy","qty":7}`

// TestClientLossyNetwork: whatever the network loses, one order is placed
// once. A request dropped before the server executes it; an answer lost,
// or cut part-way, after the server committed the order (the retry gets
// the replay); several of these in a row. The server sees the same key and
// the same body bytes on every attempt.
func TestClientLossyNetworkMemory(t *testing.T) {
	t.Parallel()
	testClientLossyNetwork(t, false)
}

func TestClientLossyNetworkPostgres(t *testing.T) {
	t.Parallel()
	testClientLossyNetwork(t, true)
}

func testClientLossyNetwork(t *testing.T, pg bool) {
	e := startClientEnv(t, envOptions{}, pg)
	for _, tc := range []struct {
		name         string
		faults       []lossyproxy.Fault
		wantArrivals int  // order requests the server saw
		wantReplay   bool // the answer the client got is a replay
	}{
		{"request dropped", []lossyproxy.Fault{lossyproxy.DropRequest}, 1, false},
		{"answer lost after commit", []lossyproxy.Fault{lossyproxy.DropAnswer}, 2, true},
		{"answer cut after commit", []lossyproxy.Fault{lossyproxy.CutAnswer}, 2, true},
		{"all of them", []lossyproxy.Fault{lossyproxy.DropRequest, lossyproxy.DropAnswer, lossyproxy.CutAnswer, lossyproxy.DropAnswer}, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid, tok := e.newUser(t)
			e.setFaults(tc.faults...)
			// A reader without GetBody: the transport buffers it.
			resp, got := e.mustPlace(t, context.Background(), tok, io.MultiReader(strings.NewReader(aaplBody)))
			if resp.StatusCode != http.StatusCreated || got["symbol"] != "AAPL" || got["qty"] != 7.0 {
				t.Fatalf("answer %d %v, want 201 with the order", resp.StatusCode, got)
			}
			if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != tc.wantReplay {
				t.Fatalf("Idempotent-Replayed %v, want %v", replayed, tc.wantReplay)
			}
			list := e.orders(t, tok)
			if len(list) != 1 || list[0].(map[string]any)["id"] != got["id"] {
				t.Fatalf("orders %v, want exactly the one placed (id %v)", list, got["id"])
			}
			if n := e.auditCounts(t, uid)["order_placed"]; n != 1 {
				t.Fatalf("%d order_placed audit rows, want 1", n)
			}
			key, _ := got["client_order_id"].(string)
			mine := e.rec.byKey(key)
			if len(mine) != tc.wantArrivals {
				t.Fatalf("the server saw %d requests with the order's key, want %d", len(mine), tc.wantArrivals)
			}
			onlyKey(t, mine, aaplBody)
		})
	}
}

// TestClientWaitsOutInFlight: a duplicate of an order that is still
// running gets 409 idempotency_in_flight with Retry-After; the transport
// waits that long, retries the same key, and gets the replay.
func TestClientWaitsOutInFlight(t *testing.T) {
	t.Parallel()
	release, entered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := startClientEnv(t, envOptions{beforeFill: func(context.Context, order) {
		once.Do(func() { close(entered); <-release }) // the first order waits for the test
	}}, false)
	t.Cleanup(func() { closeOnce(release) })
	_, tok := e.newUser(t)
	key := idemclient.NewKey()

	// The first request, sent directly, claims the key and stays in its
	// handler.
	first := make(chan response, 1)
	go func() {
		r, _ := e.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: aaplBody})
		first <- r
	}()
	<-entered

	// The client's request with the same key and body, through the proxy.
	type result struct {
		resp *http.Response
		body map[string]any
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := e.place(idemclient.WithKey(context.Background(), key), tok, strings.NewReader(aaplBody))
		var m map[string]any
		if err == nil {
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			_ = json.Unmarshal(raw, &m)
		}
		done <- result{resp, m, err}
	}()

	// The server answers the client 409 in flight; then the first order
	// may finish.
	a := e.rec.wait(t, func(a arrival) bool { return a.status == http.StatusConflict })
	if a.code != idemclient.CodeInFlight {
		t.Fatalf("duplicate answered %d %q, want 409 %s", a.status, a.code, idemclient.CodeInFlight)
	}
	close(release)
	orig := <-first
	expect(t, orig, http.StatusCreated, "")

	var res result
	select {
	case res = <-done:
	case <-time.After(waitLimit):
		t.Fatalf("the client did not finish within %v", waitLimit)
	}
	if res.err != nil || res.resp.StatusCode != http.StatusCreated || res.resp.Header.Get("Idempotent-Replayed") != "true" || res.body["id"] != orig.Body["id"] {
		t.Fatalf("client got %v %v, want the replay of order %v", res.resp, res.err, orig.Body["id"])
	}
	seen := e.rec.byKey(key)
	onlyKey(t, seen, aaplBody)
	if len(seen) != 3 { // the first, the client's 409, the client's replay
		t.Fatalf("the server saw %d requests with the key, want 3", len(seen))
	}
	// The replay came no earlier than the 409's Retry-After (5s).
	if gap := seen[2].at.Sub(a.at); gap < 5*time.Second {
		t.Fatalf("the retry came %v after the 409, before its Retry-After of 5s", gap)
	}
	if n := len(e.orders(t, tok)); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

// TestClientCancelStopsWaiting: cancelling the context while the transport
// waits out a 409 in flight's Retry-After ends the request at once.
func TestClientCancelStopsWaiting(t *testing.T) {
	t.Parallel()
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	e := startClientEnv(t, envOptions{beforeFill: func(context.Context, order) { entered <- struct{}{}; <-release }}, false)
	t.Cleanup(func() { closeOnce(release) })
	_, tok := e.newUser(t)
	key := idemclient.NewKey()
	first := make(chan struct{})
	go func() {
		defer close(first)
		_, _ = e.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: aaplBody})
	}()
	t.Cleanup(func() { closeOnce(release); <-first })
	<-entered

	ctx, cancel := context.WithCancel(idemclient.WithKey(context.Background(), key))
	defer cancel()
	// The transport tells when it starts to wait.
	tr, waiting := *e.tr, make(chan idemclient.Retry, 1)
	tr.OnRetry = func(r idemclient.Retry) { waiting <- r }
	done := make(chan error, 1)
	go func() {
		// The transport itself, not an http.Client, which gives up on a
		// cancelled context by itself.
		rq, _ := http.NewRequestWithContext(ctx, "POST", e.proxy+"/api/trading/orders", strings.NewReader(aaplBody))
		rq.Header.Set("Authorization", "Bearer "+tok)
		resp, err := tr.RoundTrip(rq)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	if r := <-waiting; r.Status != http.StatusConflict || r.Code != idemclient.CodeInFlight || r.Wait < 5*time.Second {
		t.Fatalf("retry %+v, want a wait of Retry-After (5s) or more after 409 %s", r, idemclient.CodeInFlight)
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		// Not a speed bound: the wait it must cut short is the 409's
		// Retry-After of 5s.
		if d := time.Since(cancelled); d >= 4*time.Second {
			t.Fatalf("returned %v after the cancel: it waited out the Retry-After", d)
		}
	case <-time.After(waitLimit):
		t.Fatalf("still waiting %v after the cancel", waitLimit)
	}
	if n := len(e.rec.byKey(key)); n != 1 {
		t.Fatalf("the server saw the client %d times, want once (the 409)", n)
	}
}

// TestClientFinalAnswers: 422, 409 previous_failed and 409
// outcome_unknown are not retried (the server sees the request once) and
// come back as typed errors.
func TestClientFinalAnswers(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout = time.Second, 200 * time.Millisecond
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	e := startClientEnv(t, envOptions{lease: lease, storeTimeout: storeTimeout, beforeFill: func(_ context.Context, o order) {
		if o.Symbol == "HOLD" {
			entered <- struct{}{}
			<-release // past the lease: the key goes stale
		}
	}}, false)
	t.Cleanup(func() { closeOnce(release) })
	_, tok := e.newUser(t)

	// sendOnce places body with key through the client and checks that the
	// server saw it once and that ErrorFrom reads status and code.
	sendOnce := func(t *testing.T, key, body string, status int, code string) {
		t.Helper()
		before := len(e.rec.byKey(key))
		resp, err := e.place(idemclient.WithKey(context.Background(), key), tok, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got := idemclient.ErrorFrom(resp)
		if got == nil || got.Status != status || got.Code != code {
			t.Fatalf("ErrorFrom = %v, want status %d code %q", got, status, code)
		}
		if raw, _ := io.ReadAll(resp.Body); !bytes.Contains(raw, []byte(code)) {
			t.Fatalf("body after ErrorFrom %q, want the server's", raw)
		}
		if n := len(e.rec.byKey(key)) - before; n != 1 {
			t.Fatalf("the server saw %d requests, want 1: a final answer was retried", n)
		}
	}

	t.Run("422 key reused for another order", func(t *testing.T) {
		key := idemclient.NewKey()
		resp, _ := e.mustPlace(t, idemclient.WithKey(context.Background(), key), tok, strings.NewReader(aaplBody))
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("first order: %d", resp.StatusCode)
		}
		sendOnce(t, key, `{"symbol":"AAPL","side":"buy","qty":8}`, http.StatusUnprocessableEntity, idemclient.CodeKeyBodyMismatch)
	})

	t.Run("409 previous failed", func(t *testing.T) {
		key := idemclient.NewKey()
		const xfail = `{"symbol":"XFAIL","side":"buy","qty":1}`
		sendOnce(t, key, xfail, http.StatusInternalServerError, "fill_engine_error")
		sendOnce(t, key, xfail, http.StatusConflict, idemclient.CodePreviousFailed)
	})

	t.Run("409 outcome unknown", func(t *testing.T) {
		key := idemclient.NewKey()
		const hold = `{"symbol":"HOLD","side":"buy","qty":1}`
		held := make(chan struct{})
		go func() {
			defer close(held)
			_, _ = e.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: hold})
		}()
		t.Cleanup(func() { closeOnce(release); <-held })
		<-entered
		// Duplicates answer in flight until the lease is over, then
		// outcome unknown.
		deadline := time.Now().Add(waitLimit)
		for {
			r := e.do(t, req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: hold})
			if r.Body["error"] == idemclient.CodeOutcomeUnknown {
				break
			}
			if r.Body["error"] != idemclient.CodeInFlight || time.Now().After(deadline) {
				t.Fatalf("duplicate: %s, want in flight, then outcome unknown", r)
			}
			time.Sleep(lease / 10) // waiting for the lease to run out, not for an event
		}
		sendOnce(t, key, hold, http.StatusConflict, idemclient.CodeOutcomeUnknown)
	})
}

// TestClientRetriesStoreUnavailablePostgres: with the database
// unreachable, the order route answers 503 idempotency_store_unavailable
// with Retry-After; the transport retries the same key, and once the
// database is back the order is placed, once.
func TestClientRetriesStoreUnavailablePostgres(t *testing.T) {
	t.Parallel()
	dbProxy, host, port := proxyTo(t)
	e := startClientEnv(t, envOptions{lease: 5 * time.Second, storeTimeout: 500 * time.Millisecond,
		poolOptions: []testdb.Option{testdb.Configure(func(c *pgxpool.Config) {
			c.ConnConfig.Host, c.ConnConfig.Port = host, port
			c.ConnConfig.ConnectTimeout = 2 * time.Second
		})}}, true)
	_, tok := e.newUser(t)

	dbProxy.Cut()
	key := idemclient.NewKey()
	type result struct {
		resp *http.Response
		body map[string]any
	}
	done := make(chan result, 1)
	go func() {
		resp, body := e.mustPlace(t, idemclient.WithKey(context.Background(), key), tok, strings.NewReader(aaplBody))
		done <- result{resp, body}
	}()
	a := e.rec.wait(t, func(a arrival) bool { return a.status != 0 })
	if a.status != http.StatusServiceUnavailable || a.code != idemclient.CodeStoreUnavailable {
		t.Fatalf("with the database cut: %d %q, want 503 %s", a.status, a.code, idemclient.CodeStoreUnavailable)
	}
	dbProxy.Restore()

	var res result
	select {
	case res = <-done:
	case <-time.After(waitLimit):
		t.Fatalf("the client did not finish within %v", waitLimit)
	}
	if res.resp.StatusCode != http.StatusCreated {
		t.Fatalf("after the database came back: %d %v, want 201", res.resp.StatusCode, res.body)
	}
	seen := e.rec.byKey(key)
	onlyKey(t, seen, aaplBody)
	if len(seen) < 2 || seen[len(seen)-1].status != http.StatusCreated {
		t.Fatalf("the server saw %d requests with the key, want the 503 and the retry that placed it", len(seen))
	}
	if n := len(e.orders(t, tok)); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

var closeMu sync.Mutex

// closeOnce closes ch unless it is closed already.
func closeOnce(ch chan struct{}) {
	closeMu.Lock()
	defer closeMu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}
