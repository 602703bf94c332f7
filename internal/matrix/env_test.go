//go:build matrix

package matrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// behaviour is a handler's work, the same on every entry point: it gets
// the call's key and body and answers a status and a JSON body. The entry
// adapters turn it into an HTTP handler, Do's function, a gRPC method and
// a Connect procedure.
type behaviour func(ctx context.Context, h *hctx) (int, []byte)

// hctx is what a behaviour sees of its call.
type hctx struct {
	key  string
	body []byte
	e    *env
}

// answer is what a client got, in the terms every entry point shares.
type answer struct {
	handler  bool   // the handler's own answer (run now, or replayed)
	replayed bool   // the contract says it is a replay
	bypassed bool   // Do's CallInfo.Bypassed (other entries: false)
	status   int    // the handler's status (gRPC/Connect: OK 201, else 500) when handler
	code     string // the contract's idempotency_... code when not handler
	body     []byte // the handler's body when handler
	err      error  // a transport failure: no answer at all
	took     time.Duration
}

func (a answer) String() string {
	switch {
	case a.err != nil:
		return fmt.Sprintf("no answer after %v: %v", a.took.Round(time.Millisecond), a.err)
	case a.handler:
		return fmt.Sprintf("handler %d replayed=%v after %v", a.status, a.replayed, a.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s after %v", a.code, a.took.Round(time.Millisecond))
}

// caller sends one call with key and body to an entry point, bounded by ctx.
type caller func(ctx context.Context, key string, body []byte) answer

// envOpts are a fault's settings for its cell.
type envOpts struct {
	storeOpts
	h            behaviour                      // default: record
	storeTimeout time.Duration                  // default: storeTimeout
	route        func(*idempotency.RouteConfig) // adjusts the route's policy
	cfg          func(*idempotency.Config)      // adjusts the middleware's config
}

// env is one cell while it runs.
type env struct {
	t    *testing.T
	c    cell
	se   *storeEnv
	mw   *idempotency.Middleware
	call caller
	addr string // the entry's server address (none for Do)
	opts envOpts

	enabled  atomic.Bool // the kill-switch
	reg      *prometheus.Registry
	bypassed atomic.Int64 // Observations with OutcomeBypassed for a store outage
	disabled atomic.Int64 // Observations with OutcomeBypassed for the kill-switch
	passed   atomic.Int64 // Observations with OutcomePassThrough

	mu      sync.Mutex
	runs    map[string]int // handler runs by key (started, whatever happened after)
	reasons map[string]int // outcome:reason/store reason of the Observations that had one
}

// entryServers builds each entry point over mw with policy rc and h.
var entryServers = map[entryKind]func(e *env, rc idempotency.RouteConfig, h behaviour) (caller, error){
	entryHTTP:    serveHTTP,
	entryDo:      serveDo,
	entryGRPC:    serveGRPC,
	entryConnect: serveConnect,
}

// newEnv builds the cell's store, middleware and entry point; a
// construction error fails the cell.
func newEnv(t *testing.T, c cell, o envOpts) *env {
	e, err := tryEnv(t, c, o)
	if err != nil {
		e.failf("construction: %v", err)
		t.FailNow()
	}
	return e
}

// tryEnv is newEnv returning the entry point's construction error.
func tryEnv(t *testing.T, c cell, o envOpts) (*env, error) {
	t.Helper()
	e := &env{t: t, c: c, opts: o, runs: map[string]int{}, reasons: map[string]int{}, reg: prometheus.NewRegistry()}
	e.enabled.Store(true)
	e.se = newStore(t, c.column, o.storeOpts)
	cfg := idempotency.Config{
		Lease: lease, StoreTimeout: cmpOr(o.storeTimeout, storeTimeout),
		Logger: quiet, Registerer: e.reg,
		Enabled: func(context.Context) bool { return e.enabled.Load() },
		Observer: func(_ context.Context, ob idempotency.Observation) {
			switch ob.Outcome {
			case idempotency.OutcomeBypassed:
				if ob.Reason == "disabled" { // the kill-switch, not a store outage
					e.disabled.Add(1)
				} else {
					e.bypassed.Add(1)
				}
			case idempotency.OutcomePassThrough:
				e.passed.Add(1)
			}
			if ob.Reason != "" || ob.StoreReason != "" {
				e.mu.Lock()
				e.reasons[string(ob.Outcome)+":"+ob.Reason+"/"+ob.StoreReason]++
				e.mu.Unlock()
			}
		},
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	mw, err := idempotency.New(e.se.store, cfg)
	if err != nil {
		e.failf("idempotency.New: %v", err)
		t.FailNow()
	}
	e.mw = mw
	rc := idempotency.RouteConfig{FailOpen: c.v.open, Transactional: c.v.tx, MinKeyLength: 16}
	if c.entry == entryHTTP {
		rc.MinKeyLength = 0 // UUID keys: the HTTP default
	}
	if o.route != nil {
		o.route(&rc)
	}
	h := o.h
	if h == nil {
		h = record
	}
	e.call, err = entryServers[c.entry](e, rc, e.counted(h))
	if e.se.proxy != nil {
		// Cleanups run last first: the proxy closes its links before the
		// entry's server waits for its handlers, so a handler stuck on a
		// black-holed link ends.
		t.Cleanup(e.se.proxy.Close)
	}
	return e, err
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

// counted wraps h to count its runs by key.
func (e *env) counted(h behaviour) behaviour {
	return func(ctx context.Context, hc *hctx) (int, []byte) {
		hc.e = e
		e.mu.Lock()
		e.runs[hc.key]++
		e.mu.Unlock()
		return h(ctx, hc)
	}
}

// started is how often the handler ran for key.
func (e *env) started(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[key]
}

// failf notes something the contract forbids; the cell fails.
func (e *env) failf(format string, args ...any) {
	e.t.Helper()
	msg := fmt.Sprintf(format, args...)
	e.mu.Lock()
	if len(e.reasons) > 0 {
		msg += fmt.Sprintf(" (observed %v)", e.reasons)
	}
	e.mu.Unlock()
	note(e.t, msg)
	e.t.Error(msg)
}

// newKey is a fresh key (a UUID: every entry point's minimum).
func newKey() string { return uuid.NewString() }

// send calls the entry point with key and a fixed body, bounded by a
// deadline far past the cell's own bound, so a hang shows as one.
func (e *env) send(key string) answer {
	return e.sendBody(key, []byte(`{"amount":10}`))
}

// sendBody is send with a body of the caller's. A call that has not
// answered a second after its deadline is reported as hung, and left to
// end when the cell's cleanup closes the proxy.
func (e *env) sendBody(key string, body []byte) answer {
	return e.sendCtx(context.Background(), key, body)
}

// sendAs is send on behalf of the user scope (scopeOf).
func (e *env) sendAs(scope, key string) answer {
	return e.sendCtx(withScope(context.Background(), scope), key, []byte(`{"amount":10}`))
}

// sendCtx is sendBody with the values of parent (its scope).
func (e *env) sendCtx(parent context.Context, key string, body []byte) answer {
	limit := e.bound() + 5*time.Second
	ctx, cancel := context.WithTimeout(parent, limit)
	start := time.Now()
	done := make(chan answer, 1)
	go func() {
		defer cancel()
		done <- e.call(ctx, key, body)
	}()
	var a answer
	select {
	case a = <-done:
	case <-time.After(limit + time.Second):
		a = answer{err: fmt.Errorf("hung: no answer %v after its deadline", time.Second)}
	}
	a.took = time.Since(start)
	return a
}

// bound is the "never hangs" limit of one call: five times its deadline
// (fail-open: two store timeouts, settled-r4 item 4) plus the margin.
func (e *env) bound() time.Duration {
	d := cmpOr(e.opts.storeTimeout, storeTimeout)
	if e.c.v.open {
		d *= 2
	}
	return 5*d + margin
}

// within checks that a answered inside the bound plus extra (the handler's
// own time).
func (e *env) within(what string, a answer, extra time.Duration) {
	e.t.Helper()
	if a.took > e.bound()+extra {
		e.failf("%s: took %v, past the bound %v", what, a.took.Round(time.Millisecond), e.bound()+extra)
	}
}

// expect checks that a is the handler's success (want "") or the
// contract's answer want.
func (e *env) expect(what string, a answer, want string) {
	e.t.Helper()
	switch {
	case a.err != nil:
		e.failf("%s: want %s, got %v", what, orHandler(want), a)
	case want == "" && !(a.handler && a.status < 300):
		e.failf("%s: want the handler's answer, got %v", what, a)
	case want != "" && a.code != want:
		e.failf("%s: want %s, got %v", what, want, a)
	}
}

func orHandler(code string) string {
	if code == "" {
		return "the handler's answer"
	}
	return code
}

// executions is how often key's effects happened: committed ledger rows
// on a transactional route, handler runs on an ordinary one.
func (e *env) executions(key string) int {
	if !e.c.v.tx {
		return e.started(key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := e.se.ledgerRows(ctx, key)
	if err != nil {
		e.failf("count the ledger: %v", err)
	}
	return n
}

// atMostOnce checks key's effects happened at most once (exactly want
// when want >= 0).
func (e *env) atMostOnce(key string, want int) {
	e.t.Helper()
	n := e.executions(key)
	if n > 1 || (want >= 0 && n != want) {
		e.failf("key %s: %d executions (handler started %d times), want %s", key[:8], n, e.started(key), map[bool]string{true: "at most 1", false: fmt.Sprint(want)}[want < 0])
	}
}

// noBypass checks that nothing was bypassed: no fault but a failed dial
// may bypass (settled-r4 item 4); the metric agrees with the Observations.
func (e *env) noBypass() {
	e.t.Helper()
	if n := e.bypassed.Load(); n != 0 {
		e.failf("%d calls bypassed, though no dial failed", n)
	}
	e.bypassMetric()
}

// bypassMetric checks that idempotency_bypasses_total, but its reason
// "disabled" (the kill-switch), counts the Observations' bypasses.
func (e *env) bypassMetric() {
	e.t.Helper()
	n := e.counter("idempotency_bypasses_total", func(label, value string) bool {
		return label != "reason" || value != "disabled"
	})
	if int64(n) != e.bypassed.Load() {
		e.failf("idempotency_bypasses_total counts %v outage bypasses, the Observations %d", n, e.bypassed.Load())
	}
}

// noBypassWithoutProbe checks settled-r4 item 4 where a probe may fail
// on a healthy database: with a store timeout short enough that a fresh
// dial and SELECT 1 may not answer within it on a loaded machine, a
// bypass is allowed, but only after a probe failed
// (idempotency_store_errors_total{operation="probe"}).
func (e *env) noBypassWithoutProbe() {
	e.t.Helper()
	if n := e.bypassed.Load(); n != 0 && e.probeFailures() == 0 {
		e.failf("%d calls bypassed, though no probe failed", n)
	}
	e.bypassMetric()
}

// probeFailures is idempotency_store_errors_total{operation="probe"}.
func (e *env) probeFailures() float64 {
	return e.counter("idempotency_store_errors_total", func(label, value string) bool {
		return label != "operation" || value == "probe"
	})
}

// counter sums the series of the counter name whose every label passes
// keep.
func (e *env) counter(name string, keep func(label, value string) bool) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		e.failf("gather the metrics: %v", err)
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if !keep(l.GetName(), l.GetValue()) {
					continue series
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// errNoTx: a transactional behaviour found no lent transaction.
var errNoTx = errors.New("no lent transaction in the handler's context")

// lentExec runs one statement through the transaction the route lent.
func lentExec(ctx context.Context, q string, args ...any) error {
	if tx, ok := idempotency.TxFromContext(ctx); ok {
		_, err := tx.Exec(ctx, q, args...)
		return err
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	return errNoTx
}

// effect is the handler's one write: a ledger row through the lent
// transaction on a transactional route; on an ordinary one the run itself
// (counted by counted) is the effect.
func (h *hctx) effect(ctx context.Context) error {
	if !h.e.c.v.tx {
		return nil
	}
	return lentExec(ctx, h.e.se.q("INSERT INTO matrix_ledger (k) VALUES ($1)"), h.key)
}

// record is the default behaviour: one effect, 201 with a small JSON body.
func record(ctx context.Context, h *hctx) (int, []byte) {
	if err := h.effect(ctx); err != nil {
		return failure(err)
	}
	return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, h.key)
}

// failure is a handler's 500.
func failure(err error) (int, []byte) {
	return 500, fmt.Appendf(nil, `{"handler_error":%q}`, strings.ReplaceAll(err.Error(), `"`, `'`))
}
