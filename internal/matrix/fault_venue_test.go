//go:build matrix

package matrix

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
	"github.com/idemkit/idempotency/examples/server/live"
)

// The venue rows (issue #35): the live order handler (examples/server/live)
// behind the cell's HTTP route sends each order to the paper venue
// (examples/venue, a real process) while the venue fails once in one way;
// the client retries with the same key. Each cell asserts one venue order
// for the key, the venue's order as the final answer, never
// idempotency_outcome_unknown while the venue answers lookups, committed
// effects exactly once on a transactional route, no bypass.
const (
	naVenueEntry = "the live order handler is an HTTP handler; Do, gRPC and Connect reach a downstream with the same derived key (the downstream package's tests)"
	naVenueStore = "the memory store does not outlive the process, and the venue tests run on databases"
	naVenueOpen  = "the live order route is fail-closed: a bypass would send the order without deduplication"
)

// venueLookupWait is the venue cells' ReconcileTimeout: a lookup is one
// HTTP round trip to a local process, but a venue just restarted after a
// crash, on a machine running the matrix's cells side by side, may take
// longer than the store timeout's default (it must stay below the lease
// less the store timeout).
const venueLookupWait = time.Second

// errHookNotCalled marks an attempt whose route did not call the hook, and
// errLookupPending one whose hook has not returned.
var (
	errHookNotCalled = errors.New("the reconcile hook was not called")
	errLookupPending = errors.New("the venue has not answered the lookup")
)

// venueFaultRows are the venue's faults, each set for one order.
var venueFaultRows = []struct{ name, fault, delay string }{
	{"accept then drop", "drop", ""},
	{"late answer", "delay", "5s"}, // past the handler's deadline (lease minus store timeout)
	{"5xx before accepting", "5xx", ""},
	{"crash before booking", "crash-before", ""},
	{"crash after booking", "crash-after", ""},
}

func venueFaults() []*fault {
	var out []*fault
	for _, r := range venueFaultRows {
		out = append(out, &fault{
			name: "venue: " + r.name,
			na: func(c column) string {
				switch {
				case c.entry != entryHTTP:
					return naVenueEntry
				case !c.store.sqlDB():
					return naVenueStore
				case c.v.open:
					return naVenueOpen
				}
				return ""
			},
			run: func(t *testing.T, c cell) { venueCell(t, c, r.fault, r.delay) },
		})
	}
	return out
}

// venueCell runs one order through the venue's fault.
func venueCell(t *testing.T, c cell, fault, delay string) {
	v := startMatrixVenue(t)
	client := &live.Client{URL: v.url()}
	keys, err := downstream.ParseKeys("m1:BgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgYGBgY=")
	if err != nil {
		t.Fatal(err)
	}
	// The hook's last lookup error: outcome_unknown is the contract's
	// answer only for a lookup the venue did not answer (restarting, or
	// slower than ReconcileTimeout on a loaded machine).
	var hookMu sync.Mutex
	var lookupErr error
	hook := live.Reconcile(client, reconciledOrder)
	e := newEnv(t, c, envOpts{
		h:   liveBehaviour(client),
		cfg: func(cfg *idempotency.Config) { cfg.DeriveKeys = keys },
		route: func(rc *idempotency.RouteConfig) {
			rc.ReconcileTimeout = venueLookupWait
			rc.Reconcile = func(ctx context.Context, info idempotency.ReconcileInfo) (any, error) {
				hookMu.Lock()
				lookupErr = errLookupPending // until it returns, which may be after the route answered
				hookMu.Unlock()
				v, err := hook(ctx, info)
				hookMu.Lock()
				lookupErr = err
				if errors.Is(err, idempotency.ErrNotDone) {
					lookupErr = nil // the venue answered: not found
				}
				hookMu.Unlock()
				return v, err
			}
		},
	})
	v.control(t, "POST", "/control/faults", map[string]any{"fault": fault, "count": 1, "delay": delay}, nil)

	key := newKey()
	var last answer
	unanswered := 0 // outcome_unknown answers whose lookup the venue did not answer
	deadline := time.Now().Add(30 * time.Second)
	for n := 1; ; n++ {
		hookMu.Lock()
		lookupErr = errHookNotCalled
		hookMu.Unlock()
		last = e.send(key)
		e.within(fmt.Sprintf("attempt %d", n), last, lease) // the handler may wait out its deadline
		// idempotency.Unsettled answers 503 store_unavailable; the retry
		// reconciles (ordinary) or executes again (transactional).
		retry := last.code == "idempotency_in_flight" || last.code == "idempotency_store_unavailable"
		if last.code == "idempotency_outcome_unknown" {
			hookMu.Lock()
			err := lookupErr
			hookMu.Unlock()
			if err != nil && err != errHookNotCalled {
				unanswered++
				retry = true // a later retry asks again
			}
		}
		if !retry || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the client's back-off
	}
	if unanswered > 0 {
		t.Logf("%d outcome_unknown answers for lookups the venue did not answer in time", unanswered)
	}
	var book struct {
		Orders []struct {
			ClientOrderID string `json:"client_order_id"`
			Qty           string `json:"qty"`
		}
	}
	v.control(t, "GET", "/control/orders", nil, &book)
	switch {
	case last.code == "idempotency_outcome_unknown":
		e.failf("final answer %v while the venue answers lookups", last)
	case len(book.Orders) != 1:
		e.failf("the venue holds %d orders for one key, want 1 (final answer %v)", len(book.Orders), last)
	case !(last.handler && last.status == http.StatusCreated) || !bytes.Contains(last.body, []byte(book.Orders[0].ClientOrderID)):
		e.failf("final answer %v %s, want 201 with the venue's order %s", last, last.body, book.Orders[0].ClientOrderID)
	}
	if c.v.tx {
		e.atMostOnce(key, 1) // the fill's ledger row, committed once
	}
	e.noBypass()
}

// liveBehaviour runs the live order handler as the cell's behaviour: the
// order goes to the venue under a client_order_id derived from the key, the
// fill answers 201 with one effect (a ledger row on a transactional
// route), an unknown outcome gives the key back.
func liveBehaviour(client *live.Client) behaviour {
	return func(ctx context.Context, hc *hctx) (int, []byte) {
		h := &live.Handler{
			Venue:  client,
			Derive: live.DeriveOrderID,
			Read: func(http.ResponseWriter, *http.Request) (live.Request, bool) {
				return live.Request{Symbol: "AAPL", Side: "buy", Qty: 1}, true
			},
			Filled: func(w http.ResponseWriter, r *http.Request, _ live.Request, o live.Order) {
				if err := hc.effect(r.Context()); err != nil {
					status, body := failure(err)
					w.WriteHeader(status)
					_, _ = w.Write(body)
					return
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"status":"filled","client_order_id":%q}`, o.ClientOrderID)
			},
			Log: quiet,
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "POST", "/orders", bytes.NewReader(hc.body)))
		return rec.Code, rec.Body.Bytes()
	}
}

// reconciledOrder is the reconcile hook's answer for an order the venue
// holds: the handler's.
func reconciledOrder(_ context.Context, _ idempotency.ReconcileInfo, o live.Order) (idempotency.Response, error) {
	return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: fmt.Appendf(nil, `{"status":"filled","client_order_id":%q}`, o.ClientOrderID)}, nil
}

// matrixVenue is a venue process of one cell, restarted on its address
// with its book whenever a crash fault ends it.
type matrixVenue struct {
	bin, book, addr string
	mu              sync.Mutex
	cmd             *exec.Cmd
	stop            chan struct{}
	done            chan struct{}
}

// venueBin builds the venue once per test binary, into a directory that
// TestMain removes.
var venueBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "matrix-venue-")
	if err != nil {
		return "", err
	}
	venueBinDir.Store(dir)
	bin := filepath.Join(dir, "venue")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/idemkit/idempotency/examples/venue").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the venue: %v\n%s", err, out)
	}
	return bin, nil
})

var venueBinDir atomic.Value // string

// TestMain removes the venue's binary after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if dir, ok := venueBinDir.Load().(string); ok {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

func startMatrixVenue(t *testing.T) *matrixVenue {
	t.Helper()
	bin, err := venueBin()
	if err != nil {
		t.Fatal(err)
	}
	v := &matrixVenue{bin: bin, book: filepath.Join(t.TempDir(), "book.jsonl"), stop: make(chan struct{}), done: make(chan struct{})}
	exited := v.start(t, "127.0.0.1:0")
	go v.supervise(exited)
	t.Cleanup(func() { close(v.stop); <-v.done })
	return v
}

// start runs the venue on addr and waits for its listening line; the
// channel closes when the process exits.
func (v *matrixVenue) start(t *testing.T, addr string) chan struct{} {
	cmd := exec.Command(v.bin, "-addr", addr, "-book", v.book)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc, exited := make(chan string, 1), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "listening" {
				addrc <- l.Addr
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case v.addr = <-addrc:
	case <-exited:
		t.Fatal("the venue exited before it listened")
	case <-time.After(30 * time.Second):
		t.Fatal("the venue did not listen within 30s")
	}
	v.mu.Lock()
	v.cmd = cmd
	v.mu.Unlock()
	return exited
}

// supervise restarts the venue after each crash until the cell ends, then
// kills it (our own child, by its pid).
func (v *matrixVenue) supervise(exited chan struct{}) {
	defer close(v.done)
	for {
		select {
		case <-v.stop:
			v.mu.Lock()
			_ = v.cmd.Process.Kill()
			v.mu.Unlock()
			<-exited
			return
		case <-exited:
		}
		cmd := exec.Command(v.bin, "-addr", v.addr, "-book", v.book)
		if err := cmd.Start(); err != nil {
			return
		}
		next := make(chan struct{})
		go func() { _ = cmd.Wait(); close(next) }()
		v.mu.Lock()
		v.cmd = cmd
		v.mu.Unlock()
		exited = next
	}
}

func (v *matrixVenue) url() string { return "http://" + v.addr }

// control calls the venue's control endpoint, again while it restarts.
func (v *matrixVenue) control(t *testing.T, method, path string, body, out any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, v.url()+path, bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d", method, path, resp.StatusCode)
			}
			if out != nil {
				if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
					t.Fatal(err)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		time.Sleep(20 * time.Millisecond) // the venue is restarting: poll
	}
}
