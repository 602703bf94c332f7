package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/downstream"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
)

// TestMain checks that no test leaves a goroutine behind, except the
// middleware's bounded background freeing of a claim whose outcome is
// unknown (an outage test may leave one running).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m), goleak.IgnoreAnyFunction("github.com/idemkit/idempotency.(*Middleware).giveBackRetrying"))
}

// waitLimit is the generous upper bound for anything a test waits for.
const waitLimit = 60 * time.Second

// envVars is a getenv a test can change while the server runs.
type envVars struct {
	mu sync.Mutex
	m  map[string]string
}

func newEnvVars(kv map[string]string) *envVars {
	v := &envVars{m: map[string]string{}}
	for k, val := range kv {
		v.m[k] = val
	}
	return v
}

func (v *envVars) get(k string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m[k]
}

func (v *envVars) set(k, val string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.m[k] = val
}

// testDeriveKeys is the live mode's keyring in tests.
var testDeriveKeys = func() *downstream.Keyring {
	k, err := downstream.ParseKeys("t1:AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM=")
	if err != nil {
		panic(err)
	}
	return k
}()

// envOptions configure one test server.
type envOptions struct {
	vars         map[string]string
	lease        time.Duration
	storeTimeout time.Duration
	orderLatency time.Duration
	beforeFill   func(ctx context.Context, o order)
	poolOptions  []testdb.Option // Postgres only
	venueURL     string          // live mode
}

// testEnv is one server under test, behind httptest, with a client.
type testEnv struct {
	*client
	srv  *server
	vars *envVars
	pool *pgxpool.Pool // nil in memory mode
}

// backend builds a testEnv: in memory, or on a fresh Postgres schema.
type backend func(t *testing.T, o envOptions) *testEnv

func memoryBackend(t *testing.T, o envOptions) *testEnv {
	return startEnv(t, o, nil)
}

func postgresBackend(t *testing.T, o envOptions) *testEnv {
	return startEnv(t, o, testdb.New(t, o.poolOptions...))
}

// mysqlBackend runs the server on a fresh MariaDB database, through a
// DATABASE_URL as a deployment would.
func mysqlBackend(t *testing.T, o envOptions) *testEnv {
	t.Helper()
	d := mysqldb.NewEmpty(t)
	vars := newEnvVars(o.vars)
	cfg := testConfig(o, vars)
	cfg.databaseURL = d.DSN
	srv, cleanup, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		cleanup()
	})
	return &testEnv{client: newClient(t, ts.URL), srv: srv, vars: vars}
}

func testConfig(o envOptions, vars *envVars) config {
	return config{
		addr:          "127.0.0.1:0",
		lease:         cmp.Or(o.lease, 30*time.Second),
		storeTimeout:  cmp.Or(o.storeTimeout, 2*time.Second),
		orderLatency:  o.orderLatency,
		getenv:        vars.get,
		sessionSecret: []byte("test-session-secret"),
		logger:        slog.New(slog.DiscardHandler),
		dbWait:        5 * time.Second,
		beforeFill:    o.beforeFill,
		venueURL:      o.venueURL,
		deriveKeys:    testDeriveKeys,
	}
}

func startEnv(t *testing.T, o envOptions, pool *pgxpool.Pool) *testEnv {
	t.Helper()
	vars := newEnvVars(o.vars)
	cfg := testConfig(o, vars)
	cfg.pool = pool
	srv, cleanup, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		cleanup()
	})
	return &testEnv{client: newClient(t, ts.URL), srv: srv, vars: vars, pool: pool}
}

// slogJSON returns a JSON logger writing to w, as the server's.
func slogJSON(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }

// rewriteHost returns the URL dsn pointing at hostport instead.
func rewriteHost(dsn, hostport string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	u.Host = hostport
	return u.String(), nil
}

// client sends requests to one server.
type client struct {
	base string
	hc   *http.Client
}

// newClient returns a client of base (http://host:port) whose idle
// connections are closed when the test ends.
func newClient(t *testing.T, base string) *client {
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(transport.CloseIdleConnections)
	return &client{base: base, hc: &http.Client{Transport: transport, Timeout: waitLimit}}
}

// response is an answer as a test sees it.
type response struct {
	Status int
	Header http.Header
	Raw    []byte
	Body   map[string]any // nil unless the body is a JSON object
}

func (r response) String() string { return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Raw)) }

// req describes a request: key "" sends no Idempotency-Key; body is sent as
// it is when a string, marshalled otherwise, omitted when nil.
type req struct {
	method, path, token, key string
	body                     any
	header                   http.Header // extra headers
}

// try sends rq and checks that the answer is JSON (every route but
// /metrics). It is safe to call from any goroutine.
func (e *client) try(rq req) (response, error) {
	var body io.Reader
	switch b := rq.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		body = bytes.NewReader(raw)
	}
	hr, err := http.NewRequest(rq.method, e.base+rq.path, body)
	if err != nil {
		return response{}, err
	}
	if rq.token != "" {
		hr.Header.Set("Authorization", "Bearer "+rq.token)
	}
	if rq.key != "" {
		hr.Header.Set("Idempotency-Key", rq.key)
	}
	for k, vs := range rq.header {
		hr.Header[k] = vs
	}
	return send(e.hc, hr)
}

func send(c *http.Client, hr *http.Request) (response, error) {
	res, err := c.Do(hr)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	out := response{Status: res.StatusCode, Header: res.Header, Raw: raw}
	if hr.URL.Path != "/metrics" {
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			return out, fmt.Errorf("%s %s: Content-Type %q, want application/json (body %s)", hr.Method, hr.URL.Path, ct, raw)
		}
		if err := json.Unmarshal(raw, &out.Body); err != nil {
			return out, fmt.Errorf("%s %s: body is not a JSON object: %v: %s", hr.Method, hr.URL.Path, err, raw)
		}
	}
	return out, nil
}

// do is try for the test's goroutine.
func (e *client) do(t *testing.T, rq req) response {
	t.Helper()
	r, err := e.try(rq)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expect checks an answer's status and, when errCode is not "", its
// "error" field.
func expect(t *testing.T, r response, status int, errCode string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("got %s, want status %d", r, status)
	}
	if errCode != "" && r.Body["error"] != errCode {
		t.Fatalf("got %s, want error %q", r, errCode)
	}
}

// newUser creates a demo user and returns its id and token.
func (e *client) newUser(t *testing.T) (int64, string) {
	t.Helper()
	r := e.do(t, req{method: "POST", path: "/api/demo/users", body: map[string]string{"name": t.Name()}})
	expect(t, r, http.StatusCreated, "")
	uid, ok := r.Body["user_id"].(float64)
	tok, _ := r.Body["token"].(string)
	if !ok || uid <= 0 || tok == "" {
		t.Fatalf("create user: %s", r)
	}
	return int64(uid), tok
}

// order posts an order.
func (e *client) order(t *testing.T, token, key string, body any) response {
	t.Helper()
	return e.do(t, req{method: "POST", path: "/api/trading/orders", token: token, key: key, body: body})
}

// orders lists the user's orders through the API.
func (e *client) orders(t *testing.T, token string) []any {
	t.Helper()
	r := e.do(t, req{method: "GET", path: "/api/trading/orders", token: token})
	expect(t, r, http.StatusOK, "")
	list, ok := r.Body["orders"].([]any)
	if !ok {
		t.Fatalf("list orders: %s", r)
	}
	return list
}

// auditCounts returns how many audit rows of each action the user has.
func (e *testEnv) auditCounts(t *testing.T, uid int64) map[string]int {
	t.Helper()
	rows, err := e.srv.data.auditLog(context.Background(), uid)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	n := map[string]int{}
	for _, r := range rows {
		n[r.Action]++
	}
	return n
}

// auditRows returns the user's audit rows of one action, contexts decoded.
func (e *testEnv) auditRows(t *testing.T, uid int64, action string) []map[string]any {
	t.Helper()
	rows, err := e.srv.data.auditLog(context.Background(), uid)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	var out []map[string]any
	for _, r := range rows {
		if r.Action != action {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.Context, &m); err != nil {
			t.Fatalf("audit context %s: %v", r.Context, err)
		}
		out = append(out, m)
	}
	return out
}

// metric returns the value of a counter, or a histogram's sample count,
// from the server's registry: 0 when the series does not exist.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// logWatcher is an io.Writer for JSON log lines that lets a test wait for a
// message.
type logWatcher struct {
	mu    sync.Mutex
	lines []map[string]any
	buf   bytes.Buffer
	cond  chan struct{} // closed and replaced on every new line
}

func newLogWatcher() *logWatcher { return &logWatcher{cond: make(chan struct{})} }

func (l *logWatcher) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadBytes('\n')
		if err != nil {
			// Incomplete line: keep it for the next write.
			rest := append([]byte(nil), line...)
			l.buf.Reset()
			l.buf.Write(rest)
			break
		}
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			m = map[string]any{"msg": strings.TrimSpace(string(line))}
		}
		l.lines = append(l.lines, m)
		close(l.cond)
		l.cond = make(chan struct{})
	}
	return len(p), nil
}

// waitFor returns the first line whose msg is msg, waiting up to waitLimit.
func (l *logWatcher) waitFor(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for _, m := range l.lines {
			if m["msg"] == msg {
				l.mu.Unlock()
				return m
			}
		}
		ch := l.cond
		l.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no %q log line within %v; got:\n%s", msg, waitLimit, l.String())
		}
	}
}

func (l *logWatcher) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, m := range l.lines {
		raw, _ := json.Marshal(m)
		b.Write(raw)
		b.WriteByte('\n')
	}
	return b.String()
}

// scanLines feeds r's lines into w until r ends; for process pipes.
func scanLines(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		_, _ = w.Write(append(sc.Bytes(), '\n'))
	}
}
