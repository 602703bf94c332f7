// Command loadgen drives the example server's order route (or, with -path,
// -body and -login=false, another route such as noopserver's) over HTTP and
// reports throughput, latency percentiles and status counts, ending with a
// one-line JSON summary (prefix "SUMMARY ").
//
// The steady modes (unique, nokey, hot) send their load through a minimal
// keep-alive HTTP/1.1 client of loadgen's own (rawhttp.go), one connection
// per client, so that loadgen's CPU on the shared cores stays small; the
// login, the hot key's first request, storm and its verification use
// net/http's client.
//
// It only ever talks to the -url given, and refuses any host that is not
// loopback. Every run stops by itself: -duration (at most 10 minutes) bounds
// the load, -timeout each request.
//
// Modes:
//
//	unique  every request carries a new Idempotency-Key (claim misses)
//	nokey   no Idempotency-Key at all (the pass-through baseline)
//	hot     one key: the first request creates the order, every measured
//	        request is a replay of it
//	storm   -keys K keys, -copies N concurrent copies of each, all released
//	        at once; counts executions (fresh 201s, no Idempotent-Replayed)
//	        and double executions (keys with more than one), and checks
//	        GET /api/trading/orders holds exactly one order per key
//
// Exit status: 0 when every answer was one the mode expects (and, for a
// storm, no key executed twice and the orders match), 1 otherwise, 2 for a
// usage error.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idempotency/bench/internal/result"
)

// The example server's order route and the body sent to it.
const (
	orderPath = "/api/trading/orders"
	orderBody = `{"symbol":"AAPL","side":"buy","qty":1}`
)

type options struct {
	url         string
	mode        string
	subject     string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	requests    int64
	timeout     time.Duration
	keys        int
	copies      int
	rounds      int
	verify      bool
	allowDouble bool
	rttURL      string
	serverPID   int
	dbPidsCmd   string
	settle      time.Duration
	path        string
	body        string
	login       bool
}

func main() {
	var o options
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.StringVar(&o.url, "url", "http://127.0.0.1:8080", "base URL of the example server (loopback only)")
	fs.StringVar(&o.mode, "mode", "unique", "unique, nokey, hot or storm")
	fs.StringVar(&o.subject, "subject", "", "label copied into the summary (e.g. A, B)")
	fs.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients (unique, nokey, hot)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured window, after the warm-up (at most 10m)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "load before the measured window, not counted")
	fs.Int64Var(&o.requests, "requests", 0, "stop after this many measured requests (0: no cap)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "deadline of each request")
	fs.IntVar(&o.keys, "keys", 50, "storm: distinct keys per round")
	fs.IntVar(&o.copies, "copies", 32, "storm: concurrent copies of each key")
	fs.IntVar(&o.rounds, "rounds", 1, "storm: rounds, each with fresh keys")
	fs.BoolVar(&o.verify, "verify", true, "storm: check the user's orders with GET /api/trading/orders")
	fs.BoolVar(&o.allowDouble, "allow-double", false, "storm: exit 0 despite double executions (a control run without the middleware)")
	fs.StringVar(&o.rttURL, "rtt-url", "", "pgrtt counter URL: report database round trips per request (loopback only)")
	fs.IntVar(&o.serverPID, "server-pid", 0, "the server's process id: report its CPU time per request")
	fs.StringVar(&o.dbPidsCmd, "db-pids-cmd", "", "a shell command printing the database's process ids, one a line (the PostgreSQL backends of the server under test): report their CPU time per request; run at the window's start and after its end")
	fs.DurationVar(&o.settle, "settle", 0, "before the load, wait up to this long for the cores to be under 30% busy (other work on the machine)")
	fs.StringVar(&o.path, "path", orderPath, "unique, nokey, hot: the route to POST to")
	fs.StringVar(&o.body, "body", orderBody, "unique, nokey, hot: the JSON body to send")
	fs.BoolVar(&o.login, "login", true, "create a demo user first and send its token (the example server); false for a server without sessions")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A hard bound on the whole run, whatever happens to the server.
	ctx, cancel := context.WithTimeout(ctx, o.settle+o.warmup+o.duration+2*o.timeout+time.Minute)
	defer cancel()

	s, ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	report(os.Stdout, s)
	if !ok {
		os.Exit(1)
	}
}

func (o options) check() error {
	if _, err := result.CheckURL(o.url); err != nil {
		return fmt.Errorf("-url: %w", err)
	}
	if o.rttURL != "" {
		if _, err := result.CheckURL(o.rttURL); err != nil {
			return fmt.Errorf("-rtt-url: %w", err)
		}
	}
	switch o.mode {
	case "unique", "nokey", "hot", "storm":
	default:
		return fmt.Errorf("-mode %q: want unique, nokey, hot or storm", o.mode)
	}
	switch {
	case o.concurrency < 1 || o.concurrency > 1024:
		return errors.New("-concurrency must be 1 to 1024")
	case o.duration <= 0 || o.warmup < 0 || o.warmup+o.duration > result.MaxDuration:
		return fmt.Errorf("-warmup plus -duration must be positive and at most %v", result.MaxDuration)
	case o.settle < 0 || o.settle > time.Minute:
		return errors.New("-settle must be 0 to 1m")
	case o.timeout <= 0 || o.timeout > time.Minute:
		return errors.New("-timeout must be positive and at most 1m")
	case o.requests < 0:
		return errors.New("-requests must not be negative")
	case o.keys < 1 || o.copies < 1 || o.rounds < 1 || o.keys*o.copies > 8192:
		return errors.New("-keys, -copies and -rounds must be positive, with keys*copies at most 8192")
	case !strings.HasPrefix(o.path, "/"):
		return errors.New("-path must start with /")
	case o.mode == "storm" && (o.path != orderPath || !o.login):
		return errors.New("-mode storm runs on the example server's order route only (no -path, -login)")
	}
	return nil
}

// client is the HTTP side: one tuned transport, loopback only, no proxy,
// no redirects, so no request can leave the -url given.
type client struct {
	base  string
	token string
	hc    *http.Client
}

func newClient(base string, conns int, timeout time.Duration) *client {
	tr := &http.Transport{
		Proxy:               nil, // never HTTP_PROXY: the target is this machine
		DialContext:         result.LoopbackDialer(5 * time.Second).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &client{base: base, hc: &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// answer is what loadgen keeps of a response.
type answer struct {
	status   int
	replayed bool
}

// do sends one request with the session token and reads the whole answer.
func (c *client) do(ctx context.Context, method, path, key string, body []byte, out any) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if out != nil && resp.StatusCode < 300 {
		err = json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return a, err
}

// login creates the run's own demo user and keeps its token.
func (c *client) login(ctx context.Context) error {
	var u struct {
		UserID int64  `json:"user_id"`
		Token  string `json:"token"`
	}
	a, err := c.do(ctx, http.MethodPost, "/api/demo/users", "", []byte(`{"name":"loadgen"}`), &u)
	if err != nil {
		return fmt.Errorf("create a demo user: %w", err)
	}
	if a.status != http.StatusCreated || u.Token == "" {
		return fmt.Errorf("create a demo user: status %d, no token", a.status)
	}
	c.token = u.Token
	return nil
}

func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func run(ctx context.Context, o options) (result.Summary, bool, error) {
	s := result.Summary{Tool: "loadgen", Subject: o.subject, Mode: o.mode, Concurrency: o.concurrency}
	conns := o.concurrency
	if o.mode == "storm" {
		conns = o.keys * o.copies
		s.Concurrency, s.Keys, s.Copies = conns, o.keys, o.copies
	}
	c := newClient(o.url, conns, o.timeout)
	defer c.close()
	if o.login {
		if err := c.login(ctx); err != nil {
			return s, false, err
		}
	}
	if o.mode == "storm" {
		ok, err := storm(ctx, c, o, &s)
		return s, ok, err
	}
	ok, err := steady(ctx, c, o, &s)
	return s, ok, err
}

// steady runs the unique, nokey and hot modes: -concurrency workers, each
// on its own raw keep-alive connection (rawClient), in a closed loop for the warm-up and the measured window (result.Load). Only
// the answers the mode expects count as requests; round trips are counted
// from the window's start, after the warm-up, over the requests sent in
// the window.
func steady(ctx context.Context, c *client, o options, s *result.Summary) (bool, error) {
	body := []byte(o.body)
	hotKey := ""
	if o.mode == "hot" {
		hotKey = newKey()
		a, err := c.do(ctx, http.MethodPost, o.path, hotKey, body, nil)
		if err != nil {
			return false, fmt.Errorf("hot key: first request: %w", err)
		}
		if a.status != http.StatusCreated || a.replayed {
			return false, fmt.Errorf("hot key: first request answered %d (replayed %v), want a fresh 201", a.status, a.replayed)
		}
	}

	s.BackgroundBusyPct = result.Settle(o.settle, 30)
	var (
		rtt0   counts
		rttErr error
		cpu    []result.CPUSample
		db0    map[int]time.Duration
		db1    map[int]time.Duration
		dbErr  error
	)
	load := result.Load{
		Workers: o.concurrency, Warmup: o.warmup, Duration: o.duration, Requests: o.requests,
		AtStart: func() {
			rtt0, rttErr = rttCounts(ctx, o.rttURL)
			if o.dbPidsCmd != "" {
				var pids []int
				pids, dbErr = listPids(ctx, o.dbPidsCmd)
				db0 = result.ProcsCPU(pids)
			}
			cpu = append(cpu, result.SampleCPU(o.serverPID))
		},
		AtEnd: func() {
			cpu = append(cpu, result.SampleCPU(o.serverPID))
			if o.dbPidsCmd != "" {
				db1 = result.ProcsCPU(slices.Collect(maps.Keys(db0)))
			}
		},
	}
	// One raw keep-alive client per worker (rawhttp.go): each request takes
	// one from the pool and puts it back, so the pool never runs dry.
	pool := make(chan *rawClient, o.concurrency)
	defer func() {
		for range len(pool) {
			(<-pool).close()
		}
	}()
	for range o.concurrency {
		rc, err := newRawClient(o.url, o.path, c.token, body, hotKey, o.mode == "unique", o.timeout)
		if err != nil {
			return false, err
		}
		pool <- rc
	}
	runCtx, cancel := context.WithTimeout(ctx, o.warmup+o.duration+2*o.timeout)
	defer cancel()
	r := load.Run(runCtx, func(ctx context.Context) result.Sample {
		rc := <-pool
		a, err := rc.do(ctx)
		pool <- rc
		return outcome(a, err, o.mode == "hot")
	})
	if rttErr != nil {
		return false, rttErr
	}
	r.Fill(s)
	if len(cpu) == 2 && s.Requests > 0 {
		result.FillCPU(s, cpu[0], cpu[1], o.serverPID > 0)
	}
	if o.dbPidsCmd != "" && dbErr == nil && db1 != nil && s.Requests > 0 {
		dbErr = fillDBCPU(ctx, o.dbPidsCmd, db0, db1, s)
	}
	if dbErr != nil {
		return false, fmt.Errorf("-db-pids-cmd: %w", dbErr)
	}
	if err := rttPerRequest(ctx, o.rttURL, rtt0, r.Sent(), s); err != nil {
		return false, err
	}
	if r.LastErr != nil {
		fmt.Fprintln(os.Stderr, "loadgen: last transport error:", r.LastErr)
	}
	return s.Errors == 0 && s.Unexpected == 0 && s.Requests > 0, nil
}

// outcome classifies one answer of a steady mode: a 201, a replay exactly
// when the mode replays, is OK.
func outcome(a answer, err error, replays bool) result.Sample {
	switch {
	case err != nil:
		return result.Sample{Outcome: result.Failed, Err: err}
	case a.status != http.StatusCreated || a.replayed != replays:
		return result.Sample{Outcome: result.Unexpected, Status: a.status, Replayed: a.replayed}
	}
	return result.Sample{Outcome: result.OK, Status: a.status, Replayed: a.replayed}
}

// storm releases -keys x -copies requests at once per round, then settles
// every key with one more request, and checks that each key executed once.
func storm(ctx context.Context, c *client, o options, s *result.Summary) (bool, error) {
	body := []byte(orderBody)
	deadline := time.Now().Add(o.duration)
	runCtx, cancel := context.WithDeadline(ctx, deadline.Add(o.timeout))
	defer cancel()
	fresh := map[string]int{}
	var keys []string
	s.Status = map[string]int64{}
	var lat result.Latencies
	var mu sync.Mutex
	record := func(key string, a answer, err error, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, d)
		s.Requests++
		if err != nil {
			s.Errors++
			return
		}
		s.Status[strconv.Itoa(a.status)]++
		switch {
		case a.status == http.StatusCreated && a.replayed:
			s.Replayed++
		case a.status == http.StatusCreated:
			fresh[key]++
		case a.status == http.StatusConflict, a.status == http.StatusServiceUnavailable:
			// in flight, or fail-closed under overload: never an execution
		default:
			s.Unexpected++
		}
	}
	began := time.Now()
	for round := range o.rounds {
		if time.Now().After(deadline) {
			s.Note = fmt.Sprintf("stopped after %d of %d rounds: -duration reached", round, o.rounds)
			break
		}
		roundKeys := make([]string, o.keys)
		for i := range roundKeys {
			roundKeys[i] = newKey()
		}
		keys = append(keys, roundKeys...)
		gate := make(chan struct{})
		var ready, wg sync.WaitGroup
		for _, key := range roundKeys {
			for range o.copies {
				ready.Add(1)
				wg.Go(func() {
					ready.Done()
					<-gate
					t := time.Now()
					a, err := c.do(runCtx, http.MethodPost, "/api/trading/orders", key, body, nil)
					record(key, a, err, time.Since(t))
				})
			}
		}
		ready.Wait()
		close(gate) // the barrier: every copy of every key goes at once
		wg.Wait()
	}
	window := time.Since(began)

	// Settle: one more request per key. A key is done once it replays; a
	// key no copy executed (all 409 or 503) executes now, and counts.
	for _, key := range keys {
		for range 50 {
			t := time.Now()
			a, err := c.do(runCtx, http.MethodPost, "/api/trading/orders", key, body, nil)
			record(key, a, err, time.Since(t))
			if err == nil && a.status == http.StatusCreated {
				break
			}
			if runCtx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	for _, key := range keys {
		n := fresh[key]
		s.Executions += int64(n)
		if n > 1 {
			s.DoubleExecutions++
		}
		if n == 0 {
			s.KeysNotExecuted++
		}
	}
	s.Keys = len(keys)
	s.DurationS = window.Seconds()
	if window > 0 {
		s.RPS = float64(len(keys)*o.copies) / window.Seconds()
	}
	lat.Fill(s)
	ok := s.DoubleExecutions == 0 || o.allowDouble
	ok = ok && s.Unexpected == 0 && s.Errors == 0 && s.KeysNotExecuted == 0
	if o.verify {
		n, verr := verifyOrders(runCtx, c, keys, s.Executions)
		if n >= 0 {
			s.OrdersInDB = &n
		}
		if verr != nil {
			s.VerifyError = verr.Error()
			if !o.allowDouble {
				ok = false
			}
		}
	}
	return ok, nil
}

// verifyOrders lists the user's orders and checks there is one per
// execution and, without double executions, exactly one per key.
func verifyOrders(ctx context.Context, c *client, keys []string, executions int64) (int, error) {
	var list struct {
		Orders []struct {
			ClientOrderID string `json:"client_order_id"`
		} `json:"orders"`
	}
	a, err := c.do(ctx, http.MethodGet, "/api/trading/orders", "", nil, &list)
	if err != nil {
		return -1, fmt.Errorf("list orders: %w", err)
	}
	if a.status != http.StatusOK {
		return -1, fmt.Errorf("list orders: status %d", a.status)
	}
	n := len(list.Orders)
	perKey := map[string]int{}
	for _, ord := range list.Orders {
		perKey[ord.ClientOrderID]++
	}
	var problems []string
	if int64(n) != executions {
		problems = append(problems, fmt.Sprintf("%d orders for %d fresh 201s", n, executions))
	}
	var twice int
	for _, key := range keys {
		if perKey[key] != 1 {
			twice++
		}
	}
	if twice > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d keys do not have exactly one order", twice, len(keys)))
	}
	if len(problems) > 0 {
		return n, errors.New(fmt.Sprint(problems))
	}
	return n, nil
}

// rttCounts reads pgrtt's counters; zero without a URL.
func rttCounts(ctx context.Context, url string) (counts, error) {
	var cs counts
	if url == "" {
		return cs, nil
	}
	c := newClient("", 1, 5*time.Second)
	defer c.close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return cs, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return cs, fmt.Errorf("pgrtt counters: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&cs); err != nil {
		return cs, fmt.Errorf("pgrtt counters: %w", err)
	}
	return cs, nil
}

// counts is pgrtt's answer.
type counts struct {
	RoundTrips int64 `json:"round_trips"`
	Xacts      int64 `json:"xacts"`
}

// rttPerRequest divides the counters' growth since before, read at the
// window's start with no request in flight, by the requests sent in the
// window, once all of them have ended.
func rttPerRequest(ctx context.Context, url string, before counts, requests int64, s *result.Summary) error {
	if url == "" || requests == 0 {
		return nil
	}
	time.Sleep(200 * time.Millisecond) // the last answers' ReadyForQuery may trail the HTTP response
	after, err := rttCounts(ctx, url)
	if err != nil {
		return err
	}
	s.RoundTripsPerReq = float64(after.RoundTrips-before.RoundTrips) / float64(requests)
	s.XactsPerReq = float64(after.Xacts-before.Xacts) / float64(requests)
	return nil
}

// listPids runs cmd with sh -c and reads the process ids it prints, one a
// line (blank lines ignored).
func listPids(ctx context.Context, cmd string) ([]int, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "sh", "-c", cmd).Output()
	if err != nil {
		return nil, fmt.Errorf("%q: %w", cmd, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%q printed %q, not a process id", cmd, f)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("%q printed no process id", cmd)
	}
	return pids, nil
}

// fillDBCPU sets s.CPUDBUs from the database processes' CPU time read at
// the window's start (db0) and end (db1, the same processes): the
// processes cmd lists now that were not there at the start were opened
// inside the window, and all their time counts. The database's time is
// then taken out of the rest of the machine's.
func fillDBCPU(ctx context.Context, cmd string, db0, db1 map[int]time.Duration, s *result.Summary) error {
	pids, err := listPids(ctx, cmd)
	if err != nil {
		return err
	}
	var fresh []int
	for _, pid := range pids {
		if _, ok := db0[pid]; !ok {
			fresh = append(fresh, pid)
		}
	}
	maps.Copy(db1, result.ProcsCPU(fresh))
	d, _ := result.ProcsDelta(db0, db1)
	s.CPUDBUs = float64(d.Microseconds()) / float64(s.Requests)
	if s.CPUOtherUs > 0 {
		s.CPUOtherUs = max(s.CPUOtherUs-s.CPUDBUs, 0)
	}
	return nil
}

// report prints the human-readable lines, then the SUMMARY.
func report(w io.Writer, s result.Summary) {
	label := s.Mode
	if s.Subject != "" {
		label = s.Subject + " " + label
	}
	fmt.Fprintf(w, "%s: %d clients, %d requests in %.2fs: %.0f req/s\n", label, s.Concurrency, s.Requests, s.DurationS, s.RPS)
	fmt.Fprintf(w, "  latency p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n", s.P50Ms, s.P90Ms, s.P99Ms, s.MaxMs)
	codes := make([]string, 0, len(s.Status))
	for code := range s.Status {
		codes = append(codes, code)
	}
	slices.Sort(codes)
	fmt.Fprint(w, "  status")
	for _, code := range codes {
		fmt.Fprintf(w, "  %s: %d", code, s.Status[code])
	}
	fmt.Fprintf(w, "  replayed: %d  errors: %d  unexpected: %d\n", s.Replayed, s.Errors, s.Unexpected)
	if s.Mode == "storm" {
		fmt.Fprintf(w, "  storm: %d keys x %d copies: executions %d, double executions %d, keys not executed %d",
			s.Keys, s.Copies, s.Executions, s.DoubleExecutions, s.KeysNotExecuted)
		if s.OrdersInDB != nil {
			fmt.Fprintf(w, ", orders in the database %d", *s.OrdersInDB)
		}
		fmt.Fprintln(w)
		if s.VerifyError != "" {
			fmt.Fprintln(w, "  verify:", s.VerifyError)
		}
	}
	if s.MachineBusyPct > 0 {
		fmt.Fprintf(w, "  cpu per request: server %.0fus, loadgen %.0fus, rest of the machine (postgres...) %.0fus; cores busy %.0f%% (%.0f%% before the load)\n",
			s.CPUServerUs, s.CPULoadgenUs, s.CPUOtherUs, s.MachineBusyPct, s.BackgroundBusyPct)
	}
	if s.CPUDBUs > 0 {
		fmt.Fprintf(w, "  cpu per request: database processes (-db-pids-cmd) %.0fus\n", s.CPUDBUs)
	}
	if s.RoundTripsPerReq > 0 {
		fmt.Fprintf(w, "  database: %.2f round trips, %.2f transactions per request\n", s.RoundTripsPerReq, s.XactsPerReq)
	}
	s.Print(w)
}
