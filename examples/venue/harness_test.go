package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/testdb"
)

// waitLimit is the generous upper bound for anything a test waits for.
const waitLimit = 60 * time.Second

// proc is a process a test started: the venue or an order server. It
// announces its address on stderr in a JSON line {"msg":"listening",
// "addr":...}.
type proc struct {
	name string
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed once the process has exited
	mu   sync.Mutex
	logs bytes.Buffer
}

// startProc starts cmd and waits for its listening line. The process is
// killed when the test ends; its log is printed when the test failed.
func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.mu.Lock()
			p.logs.Write(line)
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			var l struct{ Msg, Addr string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "listening" {
				addrc <- l.Addr
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.log())
		}
	})
	select {
	case p.addr = <-addrc:
	case <-p.done:
		t.Fatalf("%s exited before it listened:\n%s", name, p.log())
	case <-time.After(waitLimit):
		t.Fatalf("%s did not listen within %v", name, waitLimit)
	}
	return p
}

// kill sends SIGKILL to the process (our own child, by its pid) and waits
// for it to be gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// buildBinaries builds the venue and the example server into dir.
func buildBinaries(t *testing.T) (venueBin, serverBin string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		testdb.Skip(t, "no go command", "no go command to build the venue and the server with")
	}
	dir := t.TempDir()
	venueBin, serverBin = filepath.Join(dir, "venue"), filepath.Join(dir, "server")
	for bin, pkg := range map[string]string{venueBin: ".", serverBin: "../server"} {
		if out, err := exec.Command(goBin, "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return venueBin, serverBin
}

// venueProc is the venue process of a test, restarted on its address with
// its book when a crash fault ends it, as a supervisor would.
type venueProc struct {
	t    *testing.T
	bin  string
	book string
	mu   sync.Mutex
	p    *proc
	log  *proc // the first process: its log, printed on failure, has every restart's too
	addr string
	stop chan struct{}
	wg   sync.WaitGroup
	// restarts counts the restarts after a crash.
	restarts int
}

func startVenue(t *testing.T, bin string) *venueProc {
	t.Helper()
	v := &venueProc{t: t, bin: bin, book: filepath.Join(t.TempDir(), "book.jsonl"), stop: make(chan struct{})}
	v.p = startProc(t, "venue", exec.Command(bin, "-addr", "127.0.0.1:0", "-book", v.book))
	v.addr = v.p.addr
	v.log = v.p
	v.wg.Add(1)
	go v.supervise()
	t.Cleanup(func() { close(v.stop); v.wg.Wait() })
	return v
}

// supervise restarts the venue on its address whenever it exits while the
// test runs.
func (v *venueProc) supervise() {
	defer v.wg.Done()
	for {
		v.mu.Lock()
		p := v.p
		v.mu.Unlock()
		select {
		case <-v.stop:
			return
		case <-p.done:
		}
		cmd := exec.Command(v.bin, "-addr", v.addr, "-book", v.book)
		np := &proc{name: "venue", cmd: cmd, done: make(chan struct{})}
		cmd.Stderr = &lockedWriter{p: v.log}
		if err := cmd.Start(); err != nil {
			v.t.Errorf("restart the venue: %v", err)
			return
		}
		go func() { _ = cmd.Wait(); close(np.done) }()
		v.mu.Lock()
		v.p = np
		v.restarts++
		v.mu.Unlock()
		go func() { <-v.stop; np.kill() }()
	}
}

// lockedWriter appends a restarted venue's stderr to the first process's
// log.
type lockedWriter struct{ p *proc }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.logs.Write(b)
}

func (v *venueProc) url() string { return "http://" + v.addr }

// control calls the venue's control endpoint, again while the venue is
// restarting.
func (v *venueProc) control(t *testing.T, method, path string, body, out any) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, v.url()+path, rd)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d", method, path, resp.StatusCode)
			}
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		time.Sleep(20 * time.Millisecond) // the venue is restarting: poll
	}
}

// venueState is GET /control/faults.
type venueState struct {
	Faults   faultSetting `json:"faults"`
	Received int          `json:"received"`
	Orders   int          `json:"orders"`
}

func (v *venueProc) state(t *testing.T) venueState {
	t.Helper()
	var s venueState
	v.control(t, "GET", "/control/faults", nil, &s)
	return s
}

func (v *venueProc) setFaults(t *testing.T, s faultSetting) {
	t.Helper()
	var out map[string]any
	v.control(t, "POST", "/control/faults", s, &out)
}

// release sets the faults while an order is held, which releases it into
// them. It is sent once: a crash fault may end the venue before it answers,
// and the same request sent again would set the fault on the restarted
// venue, where no order meets it. A failed request passes only when the
// venue restarted meanwhile.
func (v *venueProc) release(t *testing.T, s faultSetting) {
	t.Helper()
	v.mu.Lock()
	restarts := v.restarts
	v.mu.Unlock()
	b, _ := json.Marshal(s)
	resp, err := http.Post(v.url()+"/control/faults", "application/json", bytes.NewReader(b))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /control/faults: %d", resp.StatusCode)
		}
		return
	}
	waitUntil(t, "the venue to restart after "+err.Error(), func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.restarts > restarts
	})
}

// ordersByQty counts the venue's orders per qty: each key of a test orders
// a qty of its own, so this is the venue's order count per key.
func (v *venueProc) ordersByQty(t *testing.T) map[string][]order {
	t.Helper()
	var out struct{ Orders []order }
	v.control(t, "GET", "/control/orders", nil, &out)
	m := map[string][]order{}
	for _, o := range out.Orders {
		m[o.Qty] = append(m[o.Qty], o)
	}
	return m
}

// waitUntil polls cond (state outside the test: a process, a database)
// until it holds, failing the test after waitLimit.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitLimit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// answer is a response of an order server.
type answer struct {
	Status     int
	Error      string // the body's "error", if any
	Body       map[string]any
	RetryAfter time.Duration
	Replayed   bool // Idempotent-Replayed: true
}

func (a answer) String() string {
	switch {
	case a.Error != "":
		return fmt.Sprintf("%d %s", a.Status, a.Error)
	case a.Replayed:
		return strconv.Itoa(a.Status) + " replay"
	}
	return strconv.Itoa(a.Status)
}

// order sends one order to base with key, authorised by auth (a header
// name and value), and returns the answer or the error of a connection the
// server dropped.
func sendOrder(ctx context.Context, base, key string, auth [2]string, qty int) (answer, error) {
	body := fmt.Sprintf(`{"symbol":"AAPL","side":"buy","qty":%d}`, qty)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/api/trading/orders", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set(auth[0], auth[1])
	resp, err := (&http.Client{Timeout: waitLimit}).Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &a.Body)
	a.Error, _ = a.Body["error"].(string)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		a.RetryAfter = time.Duration(s) * time.Second
	}
	return a, nil
}

// retryable reports whether a client retries the answer with the same key:
// the contract's "try again" answers.
func (a answer) retryable() bool {
	switch {
	case a.Status == http.StatusServiceUnavailable, a.Status == http.StatusTooManyRequests:
		return true
	case a.Status == http.StatusConflict && a.Error == "idempotency_in_flight":
		return true
	}
	return false
}

// settle is the client's retry loop: it sends the order until an answer is
// final (not a retryable one, not a dropped connection), honouring
// Retry-After (at most a second), to whichever server base returns at the
// time. It returns the final answer and how many requests it sent. Safe
// to call from any goroutine.
func settle(base func() string, key string, auth [2]string, qty int) (answer, int, error) {
	deadline := time.Now().Add(waitLimit)
	for n := 1; ; n++ {
		a, err := sendOrder(context.Background(), base(), key, auth, qty)
		if err == nil && !a.retryable() {
			return a, n, nil
		}
		if time.Now().After(deadline) {
			return a, n, fmt.Errorf("no final answer within %v: last %v %v", waitLimit, a, err)
		}
		pause := 100 * time.Millisecond
		if err == nil && a.RetryAfter > 0 {
			pause = min(a.RetryAfter, time.Second)
		}
		time.Sleep(pause) // the client's back-off, as Retry-After asks
	}
}

// jsonDecode reads a response's JSON body into dst.
func jsonDecode(resp *http.Response, dst any) error {
	return json.NewDecoder(resp.Body).Decode(dst)
}
