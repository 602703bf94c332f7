package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/internal/testdb"
)

// Settings of the crash test. The first server's fill latency outlives the
// handler's deadline (lease minus store timeout, from the claim), so its
// orders are still in their handlers when it is killed; the second server's
// latency fits well inside that deadline.
const (
	crashLease         = 4 * time.Second
	crashStoreTimeout  = 500 * time.Millisecond
	crashSlowLatency   = 10 * time.Second
	crashFastLatency   = 100 * time.Millisecond
	crashSessionSecret = "crash-test-session-secret"
	crashStormWorkers  = 8
)

// TestCrashMidHandlerPostgres: a server is killed with SIGKILL while
// transactional orders are inside their handlers. Their claims live in the
// handlers' transactions (DESIGN.md "Transactional routes: one
// transaction"), so the database rolls everything back, the claims
// included: no row is left for either key. A restarted server executes the
// retries at once, with no lease to wait out, exactly once per key, also
// when several retries race for one key; every later retry replays.
//
// Two users, two keys, both in flight when the process dies: key A is
// retried by one client, sequentially; key B by crashStormWorkers clients
// at once. The scenario runs with responses stored as they are, and
// sealed (IDEMPOTENCY_SEAL_KEYS).
func TestCrashMidHandlerPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a binary")
	}
	t.Parallel()
	t.Run("Plaintext", func(t *testing.T) { crashMidHandler(t, nil) })
	t.Run("Sealed", func(t *testing.T) { crashMidHandler(t, []string{envSealKeys + "=" + crashSealKeys}) })
}

// crashSealKeys are the sealed run's keys: k2 active, k1 to open older rows.
const crashSealKeys = "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="

// crashMidHandler is TestCrashMidHandlerPostgres with env added to the
// servers' environment.
func crashMidHandler(t *testing.T, env []string) {
	t.Parallel()
	dsn := testdb.NewDSN(t) // its schema is dropped after the processes are gone (cleanups run in reverse)
	db := crashDB(t, dsn)
	bin := crashBuildServer(t)

	// The first server's connections carry an application_name of their
	// own, so the test can watch its sessions in pg_stat_activity.
	appName := "idem_crash_" + crashRandHex(6)
	dsn1, err := crashWithParam(dsn, "application_name", appName)
	if err != nil {
		t.Fatal(err)
	}
	common := []string{"-addr", "127.0.0.1:0", "-lease", crashLease.String(), "-store-timeout", crashStoreTimeout.String()}

	// 1. The first server: slow fills.
	p1 := crashStart(t, bin, env, append([]string{"-database-url", dsn1, "-order-latency", crashSlowLatency.String()}, common...)...)
	uidA, tokA := p1.c.newUser(t)
	uidB, tokB := p1.c.newUser(t)
	keyA, keyB := uuid.NewString(), uuid.NewString()
	bodyA := map[string]any{"symbol": "AAPL", "side": "buy", "qty": 3}
	bodyB := map[string]any{"symbol": "MSFT", "side": "sell", "qty": 5}
	orderA := req{method: "POST", path: "/api/trading/orders", token: tokA, key: keyA, body: bodyA}
	orderB := req{method: "POST", path: "/api/trading/orders", token: tokB, key: keyB, body: bodyB}

	type result struct {
		r   response
		err error
	}
	sent := time.Now()
	originals := make(chan result, 2)
	for _, rq := range []req{orderA, orderB} {
		go func() {
			r, err := p1.c.try(rq)
			originals <- result{r, err}
		}()
	}

	// 2. Wait until both handlers hold their claims inside their
	// transactions ("idle in transaction": BEGIN and the claim done),
	// without sending a request that could win a claim itself. The claims
	// are not visible to other sessions: no committed row exists.
	killBy := sent.Add(crashLease - crashStoreTimeout) // the handlers' deadline: a 504 would mark the keys failed
	for {
		var inTx int
		crashScan(t, db, []any{&inTx}, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'idle in transaction'`, appName)
		if inTx == 2 {
			break
		}
		if time.Now().After(killBy) {
			t.Fatalf("the orders were not in their handlers in time: %d sessions in a transaction\n%s", inTx, p1.logs.String())
		}
		time.Sleep(5 * time.Millisecond) // polling the database, not synchronisation
	}
	if n := crashCount(t, db, `SELECT count(*) FROM idempotency_keys WHERE idem_key IN ($1, $2)`, keyA, keyB); n != 0 {
		t.Fatalf("%d committed rows for keys whose handlers still run, want none (the claims live in the handlers' transactions)", n)
	}
	// A duplicate sees the key in flight, through the API too: its claim
	// waits on the owner's uncommitted row for the lock wait, then answers.
	for _, rq := range []req{orderA, orderB} {
		r, _ := p1.send(t, rq)
		expect(t, r, http.StatusConflict, "idempotency_in_flight")
	}

	// 3. kill -9, mid-handler.
	if err := p1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if time.Now().After(killBy) {
		t.Fatalf("killed %v after the orders were sent, past their handlers' deadline", killed.Sub(sent))
	}
	err = p1.wait(t)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the first server's exit: %v", err)
	}
	for range 2 {
		select {
		case res := <-originals:
			if res.err == nil {
				t.Fatalf("an order in the killed server got an answer: %s", res.r)
			}
		case <-time.After(waitLimit):
			t.Fatal("an order sent to the killed server never returned")
		}
	}
	t.Logf("killed %v after sending the orders", killed.Sub(sent).Round(time.Millisecond))

	// 4. The database saw the connections go and rolled back: no session
	// of the first server is left, nothing was written, and no row holds
	// either key.
	for deadline := time.Now().Add(waitLimit); ; {
		var sessions int
		crashScan(t, db, []any{&sessions}, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName)
		if sessions == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions of the killed server are still open", sessions)
		}
		time.Sleep(5 * time.Millisecond) // polling the database
	}
	for _, u := range []struct {
		uid int64
		key string
	}{{uidA, keyA}, {uidB, keyB}} {
		if n := crashCount(t, db, `SELECT count(*) FROM paper_orders WHERE user_id = $1`, u.uid); n != 0 {
			t.Fatalf("user %d has %d orders after the crash, want 0", u.uid, n)
		}
		if n := crashCount(t, db, `SELECT count(*) FROM audit_log WHERE user_id = $1`, u.uid); n != 0 {
			t.Fatalf("user %d has %d audit rows after the crash, want 0", u.uid, n)
		}
		if n := crashCount(t, db, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1`, u.key); n != 0 {
			t.Fatalf("key of user %d has %d rows after the crash, want none", u.uid, n)
		}
	}

	// 5. Restart on the same database: fast fills, same lease, store
	// timeout and session secret (the tokens stay valid).
	p2 := crashStart(t, bin, env, append([]string{"-database-url", dsn, "-order-latency", crashFastLatency.String()}, common...)...)
	restarted := time.Now()
	t.Logf("restarted %v after the kill", restarted.Sub(killed).Round(time.Millisecond))

	// 6. Key B: crashStormWorkers clients retry at once, in a loop, until
	// each has had a replay. Key A, meanwhile: one client retries once,
	// and executes at once: there is no lease to wait out.
	storm := make([][]result, crashStormWorkers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range crashStormWorkers {
		wg.Go(func() {
			<-start
			deadline := time.Now().Add(waitLimit)
			for {
				r, err := p2.c.try(orderB)
				storm[i] = append(storm[i], result{r, err})
				switch {
				case err != nil:
					return
				case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
					return
				case r.Status != http.StatusConflict && r.Status != http.StatusCreated && !crashUnavailable(r):
					return
				case time.Now().After(deadline):
					return
				}
				time.Sleep(5 * time.Millisecond) // a client's retry pause
			}
		})
	}
	close(start)
	executedA, unavailableA := p2.send(t, orderA)
	crashCheckOrder(t, executedA, false, nil, bodyA)
	t.Logf("key A executed by its first retry %v after the restart", time.Since(restarted).Round(time.Millisecond))
	idA := executedA.Body["id"]
	replaysA := 0
	for range 2 {
		r, unavailable := p2.send(t, orderA)
		unavailableA += unavailable
		crashCheckOrder(t, r, true, idA, bodyA)
		replaysA++
	}

	wg.Wait()
	var executedB []response
	replaysB, inFlightB, unavailableB := 0, 0, 0
	for i, rs := range storm {
		if len(rs) == 0 {
			t.Fatalf("storm client %d sent nothing", i)
		}
		for _, res := range rs {
			if res.err != nil {
				t.Fatalf("storm client %d: %v", i, res.err)
			}
			r := res.r
			switch {
			case r.Status == http.StatusConflict && r.Body["error"] == "idempotency_in_flight":
				inFlightB++
			case crashUnavailable(r):
				unavailableB++
			case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
				executedB = append(executedB, r)
			case r.Status == http.StatusCreated:
				replaysB++
			default:
				t.Fatalf("storm client %d: unexpected answer %s", i, r)
			}
		}
		if last := rs[len(rs)-1].r; last.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("storm client %d ended without a replay: %s", i, last)
		}
	}
	if len(executedB) != 1 {
		t.Fatalf("key B executed %d times under %d concurrent retries, want once: %v", len(executedB), crashStormWorkers, executedB)
	}
	crashCheckOrder(t, executedB[0], false, nil, bodyB)
	idB := executedB[0].Body["id"]
	for _, rs := range storm {
		for _, res := range rs {
			if res.r.Status == http.StatusCreated {
				crashCheckOrder(t, res.r, res.r.Header.Get("Idempotent-Replayed") == "true", idB, bodyB)
			}
		}
	}
	t.Logf("key B: %d clients, %d answers 409 in flight, 1 execution, %d replays; %d answers 503 store unavailable",
		crashStormWorkers, inFlightB, replaysB, unavailableB)

	// 7. The database: one order and one order_placed row per user, one
	// idempotency_replay row per replay, the key completed under its
	// first attempt (nothing to take over: no row survived the crash).
	for _, u := range []struct {
		uid     int64
		key     string
		id      any
		replays int
	}{{uidA, keyA, idA, replaysA}, {uidB, keyB, idB, replaysB}} {
		var orders int
		var orderID int64
		var clientOrderID string
		crashScan(t, db, []any{&orders, &orderID, &clientOrderID},
			`SELECT count(*) OVER (), id, COALESCE(client_order_id, '') FROM paper_orders WHERE user_id = $1`, u.uid)
		if orders != 1 || float64(orderID) != u.id || clientOrderID != u.key {
			t.Fatalf("user %d: %d orders (id %d, client order id %q), want 1 (id %v, %s)", u.uid, orders, orderID, clientOrderID, u.id, u.key)
		}
		if n := crashCount(t, db, `SELECT count(*) FROM paper_orders WHERE client_order_id = $1`, u.key); n != 1 {
			t.Fatalf("key %s has %d orders, want 1", u.key, n)
		}
		if n := crashCount(t, db, `SELECT count(*) FROM audit_log WHERE user_id = $1 AND action = 'order_placed'`, u.uid); n != 1 {
			t.Fatalf("user %d has %d order_placed audit rows, want 1", u.uid, n)
		}
		if n := crashCount(t, db, `SELECT count(*) FROM audit_log WHERE user_id = $1 AND action = 'idempotency_replay'`, u.uid); n != u.replays {
			t.Fatalf("user %d has %d idempotency_replay audit rows, want %d", u.uid, n, u.replays)
		}
		k := crashKey(t, db, u.key, u.uid)
		if k.status != "completed" || k.attempt != 1 || k.responseCode == nil || *k.responseCode != http.StatusCreated {
			t.Fatalf("key of user %d at the end: %+v, want completed, attempt 1, 201", u.uid, k)
		}
		if want := map[bool]string{true: "k2"}[env != nil]; k.sealKeyID != want {
			t.Fatalf("key of user %d at the end: seal key id %q, want %q", u.uid, k.sealKeyID, want)
		}
	}
	metrics := p2.c.do(t, req{method: "GET", path: "/metrics"})
	if misses := crashMetric(t, string(metrics.Raw), `idempotency_miss_total{endpoint="POST /api/trading/orders"}`); misses != 2 {
		t.Fatalf("idempotency_miss_total = %v on the restarted server, want 2 (one execution per key)", misses)
	}

	// 8. SIGTERM: the second server drains and exits 0.
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p2.wait(t); err != nil {
		t.Fatalf("the second server's exit: %v\n%s", err, p2.logs.String())
	}
	p2.logs.waitFor(t, "stopped")
	if unavailableA+unavailableB > 0 {
		t.Logf("the restarted server's log without its 409 and 201 request lines:\n%s", p2.notable())
	}
	t.Logf("whole scenario: %v", time.Since(sent).Round(time.Millisecond))
}

// crashProc is a server process under test.
type crashProc struct {
	cmd     *exec.Cmd
	logs    *logWatcher
	scanned chan struct{}
	exited  bool
	c       *client
}

// crashStart runs the server binary with args and SESSION_SECRET set, waits
// for its listening line and returns it with a client. The process is
// killed when the test ends unless the test waited for it.
func crashStart(t *testing.T, bin string, env []string, args ...string) *crashProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(serverEnv(), envSessionSecret+"="+crashSessionSecret), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &crashProc{cmd: cmd, logs: newLogWatcher(), scanned: make(chan struct{})}
	go func() {
		scanLines(stderr, p.logs)
		close(p.scanned)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: log without its 409 and 201 request lines:\n%s", filepath.Base(bin), p.notable())
		}
	})
	t.Cleanup(func() {
		if !p.exited {
			_ = cmd.Process.Kill() // our own child, by its pid
			<-p.scanned
			_ = cmd.Wait()
		}
	})
	listening := p.logs.waitFor(t, "listening")
	wantLease, wantTimeout := crashLease.String(), crashStoreTimeout.String()
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-lease":
			wantLease = args[i+1]
		case "-store-timeout":
			wantTimeout = args[i+1]
		}
	}
	if (listening["store"] != "postgres" && listening["store"] != "mysql") || listening["lease"] != wantLease || listening["store_timeout"] != wantTimeout {
		t.Fatalf("listening line %v", listening)
	}
	p.c = newClient(t, "http://"+fmt.Sprint(listening["addr"]))
	return p
}

// send sends rq, again while the answer is 503 idempotency_store_unavailable
// (which runs nothing) or, after one, 409 in flight, and returns the last
// answer and how many 503s came before it.
func (p *crashProc) send(t *testing.T, rq req) (response, int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for n := 0; ; {
		r := p.c.do(t, rq)
		// After a 503, 409 in flight is the refused attempt's own claim:
		// its begin timed out after the INSERT was sent, and the database
		// ends that transaction only when it reads the closed connection.
		// A client retries it too; before any 503 it is an answer.
		inFlight := n > 0 && r.Status == http.StatusConflict && r.Body["error"] == "idempotency_in_flight"
		if !crashUnavailable(r) && !inFlight || time.Now().After(deadline) {
			return r, n
		}
		if !inFlight {
			n++
		}
		t.Logf("%s: retrying", r)
		time.Sleep(50 * time.Millisecond) // the client's retry pause
	}
}

// notable returns the log lines other than the access log's 409 and 201
// lines, of which a retry loop writes hundreds.
func (p *crashProc) notable() string {
	var b strings.Builder
	for line := range strings.Lines(p.logs.String()) {
		if strings.Contains(line, `"msg":"request"`) && (strings.Contains(line, `"status":409`) || strings.Contains(line, `"status":201`)) {
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

// crashUnavailable reports a fail-closed refusal: nothing ran.
func crashUnavailable(r response) bool {
	return r.Status == http.StatusServiceUnavailable && r.Body["error"] == "idempotency_store_unavailable"
}

// wait waits, with a bound, for the process to exit and returns cmd.Wait's
// result.
func (p *crashProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.scanned:
	case <-time.After(waitLimit):
		t.Fatalf("the server did not exit\n%s", p.logs.String())
	}
	err := p.cmd.Wait()
	p.exited = true
	return err
}

// crashBuildServer builds the server binary into a temporary directory.
func crashBuildServer(t *testing.T) string {
	t.Helper()
	// go test puts its own GOROOT/bin first in PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		testdb.Skip(t, "no go command", "no go command to build the server with")
	}
	bin := filepath.Join(t.TempDir(), "server")
	start := time.Now()
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built the server in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// crashDB connects to dsn's schema for the test's own checks.
func crashDB(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func crashScan(t *testing.T, db *pgx.Conn, dst []any, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := db.QueryRow(ctx, sql, args...).Scan(dst...); err != nil {
		t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
}

func crashCount(t *testing.T, db *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	crashScan(t, db, []any{&n}, sql, args...)
	return n
}

// crashKeyRow is an order key's idempotency_keys row.
type crashKeyRow struct {
	status       string
	attempt      int
	responseCode *int
	sealKeyID    string // "": plaintext
}

func crashKey(t *testing.T, db *pgx.Conn, key string, uid int64) crashKeyRow {
	t.Helper()
	var k crashKeyRow
	crashScan(t, db, []any{&k.status, &k.attempt, &k.responseCode, &k.sealKeyID}, `
		SELECT status, attempt, response_code::int, coalesce(seal_key_id, '')
		FROM idempotency_keys
		WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3`,
		key, strconv.FormatInt(uid, 10), ordersEndpoint)
	return k
}

// crashCheckOrder checks an order answer: 201, replayed or not, the order
// that was asked for, and (when id is not nil) the order id.
func crashCheckOrder(t *testing.T, r response, replayed bool, id any, want map[string]any) {
	t.Helper()
	expect(t, r, http.StatusCreated, "")
	if got := r.Header.Get("Idempotent-Replayed") == "true"; got != replayed {
		t.Fatalf("replayed = %v, want %v: %s", got, replayed, r)
	}
	if replayed != (r.Body["idempotency_replayed"] == true) {
		t.Fatalf("idempotency_replayed field of %s, replayed %v", r, replayed)
	}
	oid, ok := r.Body["id"].(float64)
	if !ok || (id != nil && oid != id) {
		t.Fatalf("order id of %s, want %v", r, id)
	}
	if loc := r.Header.Get("Location"); loc != "/api/trading/orders/"+strconv.FormatInt(int64(oid), 10) {
		t.Fatalf("Location %q of %s", loc, r)
	}
	if r.Body["symbol"] != want["symbol"] || r.Body["side"] != want["side"] || r.Body["qty"] != float64(want["qty"].(int)) || r.Body["status"] != "filled" {
		t.Fatalf("order %s, want %v", r, want)
	}
}

// crashMetric returns the value of one series in a Prometheus text
// exposition, 0 when absent.
func crashMetric(t *testing.T, exposition, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(exposition)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// crashWithParam returns dsn with one more query parameter.
func crashWithParam(dsn, name, value string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func crashRandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
