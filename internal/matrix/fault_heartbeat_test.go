//go:build matrix

package matrix

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// RouteConfig.Heartbeat under a fault: the link cut while the lease is
// being renewed, and the key taken from its owner (its attempt moved on,
// as a fenced takeover does) while the handler runs. Either way the
// handler's context is cancelled with ErrLeaseLost (before the lease
// lapses on a cut link), nothing is recorded, and the call answers 503
// idempotency_store_unavailable (gRPC and Connect: Unavailable with
// IDEMPOTENCY_LEASE_LOST). The key never runs twice. A process killed
// mid-handler stops renewing: its key is stale one lease later (runCrash).

const (
	naHeartbeatTx  = "a transactional route refuses Heartbeat at construction"
	naHeartbeatMem = "the memory store has no link to cut and no table to force an owner out of"
)

func heartbeatFaults() []*fault {
	na := func(c column) string {
		switch {
		case c.v.tx:
			return naHeartbeatTx
		case !c.store.sqlDB():
			return naHeartbeatMem
		}
		return ""
	}
	return []*fault{
		{name: "heartbeat, link cut", na: na, run: func(t *testing.T, c cell) { runHeartbeatLost(t, c, true) }},
		{name: "heartbeat, ownership lost", na: na, run: func(t *testing.T, c cell) { runHeartbeatLost(t, c, false) }},
		{name: "heartbeat, kill -9", na: both(func(c column) string {
			if c.v.tx {
				return naHeartbeatTx
			}
			return ""
		}, needsDB(naMemoryCr)), run: func(t *testing.T, c cell) { runCrash(t, c, true) }},
	}
}

// runHeartbeatLost: the handler makes its effect and waits for its
// context; the link is cut (cut) or the row's attempt moved on. The call
// answers the lost lease, the handler's context ended with ErrLeaseLost
// (on a cut link before the lease could lapse), and after the lease the
// retry finds the key stale (cut: outcome_unknown; taken: the new
// attempt is in flight or stale), never running it again.
func runHeartbeatLost(t *testing.T, c cell, cut bool) {
	entered := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var cause error
	var ended time.Time
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := hc.effect(ctx); err != nil {
			return failure(err)
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		mu.Lock()
		cause, ended = context.Cause(ctx), time.Now()
		mu.Unlock()
		return record(ctx, hc)
	}
	e := newEnv(t, c, envOpts{h: h, route: func(rc *idempotency.RouteConfig) {
		rc.Heartbeat, rc.MaxRun = true, 10*lease
	}})
	key := newKey()
	var start time.Time // before the claim: its lease cannot end before start + lease
	done := make(chan answer, 1)
	go func() {
		// A claim this loaded machine answered 503 (its store timeout) is
		// sent again after Retry-After, as a client would.
		var a answer
		for range 4 {
			mu.Lock()
			start = time.Now()
			mu.Unlock()
			if a = e.send(key); e.started(key) > 0 || a.code != "idempotency_store_unavailable" {
				break
			}
			time.Sleep(time.Second) // Retry-After, not a synchronisation
		}
		done <- a
	}()
	select {
	case <-entered:
	case a := <-done:
		e.failf("the call answered before its handler ran: %v", a)
		return
	}
	mu.Lock()
	claimed := start
	mu.Unlock()
	// A renewal confirmed before the cut or the takeover was sent before
	// now: the lease ends by now + lease at the latest.
	broken := time.Now()
	if cut {
		e.se.proxy.Cut()
	} else if _, err := e.se.direct.ExecContext(context.Background(),
		e.se.q("UPDATE idempotency_keys SET attempt = attempt + 1 WHERE idem_key = $1"), key); err != nil {
		t.Fatal(err)
	}
	a := <-done
	e.within("call whose lease was lost", a, lease)
	want := "idempotency_store_unavailable"
	if c.entry == entryGRPC || c.entry == entryConnect {
		want = "idempotency_lease_lost"
	}
	e.expect("call whose lease was lost", a, want)
	mu.Lock()
	if !errors.Is(cause, idempotency.ErrLeaseLost) {
		e.failf("the handler's context ended with %v, want ErrLeaseLost", cause)
	}
	if cut && !ended.Before(broken.Add(lease)) {
		e.failf("the handler's context ended %v after the link was cut (%v after the claim began), past any lease it held (%v)",
			ended.Sub(broken).Round(time.Millisecond), ended.Sub(claimed).Round(time.Millisecond), lease)
	}
	mu.Unlock()
	e.noBypass()
	if cut {
		e.se.proxy.Restore()
	}
	time.Sleep(time.Until(broken.Add(lease + 100*time.Millisecond))) // waiting out the lease, as a client would; not a synchronisation
	again := e.retry503(key)
	e.within("retry after the lease", again, 0)
	if again.code != "idempotency_outcome_unknown" && again.code != "idempotency_in_flight" {
		e.failf("retry after a lost lease: want idempotency_outcome_unknown (or in flight), got %v", again)
	}
	e.atMostOnce(key, 1)
}
