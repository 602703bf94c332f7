//go:build matrix

package matrix

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// Duplicates that wait for the answer (RouteConfig.WaitInFlight, issue #36,
// settled-r4 item 23): a duplicate of a key in flight waits for the owner's
// outcome and answers it; past the wait, 409 in flight; a store error
// while waiting is 409 in flight on every policy, never a bypass.

func waitFaults() []*fault {
	return []*fault{
		{name: "duplicate waits, owner completes", na: ordinaryOnly, run: func(t *testing.T, c cell) {
			runWait(t, c, 1500*time.Millisecond, false, "")
		}},
		{name: "duplicate waits, owner fails", na: ordinaryOnly, run: func(t *testing.T, c cell) {
			runWait(t, c, 1500*time.Millisecond, true, "idempotency_previous_failed")
		}},
		{name: "duplicate waits, owner slower than the wait", na: ordinaryOnly, run: func(t *testing.T, c cell) {
			runWait(t, c, 100*time.Millisecond, false, "idempotency_in_flight")
		}},
		{name: "duplicate waits, link cut", na: both(ordinaryOnly, needsDB(naMemoryNet)), run: runWaitCut},
	}
}

// naWaitTx: WaitInFlight is refused on transactional routes.
const naWaitTx = "WaitInFlight is refused on transactional routes: their duplicates wait on the owner's row lock (TxLockWait)"

func ordinaryOnly(c column) string {
	if c.v.tx {
		return naWaitTx
	}
	return ""
}

// ownerWork is the owner's handler time in the wait cells: its work, not
// a synchronisation.
const ownerWork = 300 * time.Millisecond

// heldOwner is a behaviour whose first call of a key says it entered and
// then waits for hold (or works ownerWork when hold is nil); fail makes it
// answer a failure.
func heldOwner(entered chan<- struct{}, hold <-chan struct{}, fail bool) behaviour {
	var once sync.Once
	return func(ctx context.Context, hc *hctx) (int, []byte) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			if hold != nil {
				<-hold
			} else {
				time.Sleep(ownerWork)
			}
		}
		if fail {
			return 500, []byte(`{"error":"venue down"}`)
		}
		return record(ctx, hc)
	}
}

// runWait sends a key, then three duplicates once its handler runs, on a
// route whose duplicates wait up to wait: each answers want ("": the
// owner's replay), and the key executes once.
func runWait(t *testing.T, c cell, wait time.Duration, fail bool, want string) {
	entered := make(chan struct{})
	e := newEnv(t, c, envOpts{h: heldOwner(entered, nil, fail), route: func(rc *idempotency.RouteConfig) { rc.WaitInFlight = wait }})
	key := newKey()
	owner := sendOwner(e, key)
	if !ownerEntered(e, entered, owner) {
		return
	}
	dups := make([]answer, 3)
	var wg sync.WaitGroup
	for i := range dups {
		wg.Go(func() { dups[i] = e.send(key) })
	}
	wg.Wait()
	<-owner
	for _, a := range dups {
		e.within("waiting duplicate", a, wait+ownerWork)
		e.expect("waiting duplicate", a, want)
		if want == "" && !a.replayed {
			e.failf("waiting duplicate: %v, want the replay", a)
		}
	}
	e.atMostOnce(key, 1)
	e.noBypass()
}

// sendOwner sends the owner's call of key, again after a 503 answered
// before its handler ran (a loaded machine's claim; a client retries it),
// and delivers its last answer.
func sendOwner(e *env, key string) <-chan answer {
	owner := make(chan answer, 1)
	go func() {
		var a answer
		for range 3 {
			if a = e.send(key); e.started(key) > 0 || a.code != "idempotency_store_unavailable" {
				break
			}
			time.Sleep(time.Second) // Retry-After, not a synchronisation
		}
		owner <- a
	}()
	return owner
}

// ownerEntered waits for the owner's handler to run; an owner answered
// before it ran fails the cell instead of hanging it.
func ownerEntered(e *env, entered <-chan struct{}, owner <-chan answer) bool {
	select {
	case <-entered:
		return true
	case a := <-owner:
		e.failf("the owner answered before its handler ran: %v", a)
		return false
	}
}

// runWaitCut holds the owner, lets a duplicate start waiting, then cuts
// the link: the duplicate answers 409 in flight, on a fail-open route too.
func runWaitCut(t *testing.T, c cell) {
	entered, hold := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}()
	e := newEnv(t, c, envOpts{h: heldOwner(entered, hold, false), route: func(rc *idempotency.RouteConfig) { rc.WaitInFlight = 1500 * time.Millisecond }})
	key := newKey()
	owner := sendOwner(e, key)
	if !ownerEntered(e, entered, owner) {
		return
	}
	dup := make(chan answer, 1)
	go func() { dup <- e.send(key) }()
	// The owner's claim, the duplicate's, and its first re-read: it waits.
	deadline := time.Now().Add(e.bound())
	for claims(e.reg) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e.se.proxy.Cut()
	a := <-dup
	e.within("duplicate waiting on a cut link", a, 1500*time.Millisecond)
	e.expect("duplicate waiting on a cut link", a, "idempotency_in_flight")
	close(hold)
	<-owner
	e.atMostOnce(key, 1)
	e.noBypass()
}

// claims counts the claim store calls the middleware made
// (idempotency_store_duration_seconds{operation="claim"}).
func claims(g prometheus.Gatherer) int {
	mfs, _ := g.Gather()
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "idempotency_store_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == "claim" {
					n += int(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return n
}
