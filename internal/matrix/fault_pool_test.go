//go:build matrix

package matrix

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// Saturation ("A bypass needs a dial that failed"): a wait for a pooled
// connection, a pool still opening its connections and a short store
// timeout under a burst are 503 (pool_exhausted) on every policy, never a
// bypass; no key runs twice.

func poolFaults() []*fault {
	net := needsDB(naMemoryNet)
	return []*fault{
		{name: "pool busy", na: net, run: runPoolBusy},
		{name: "pool still connecting", na: net, run: func(t *testing.T, c cell) {
			// A second of store timeout: the outage probe dials while the
			// pool's own connects queue at the server, and a probe that
			// cannot connect in time would read as an outage.
			// A transactional route keeps the matrix's timeout: its handler
			// needs the lease the longer one would eat.
			var timeout time.Duration
			if !c.v.tx {
				timeout = time.Second
			}
			e := newEnv(t, c, envOpts{h: holding(100 * time.Millisecond), storeTimeout: timeout})
			e.emptyPool()
			e.burst(24, (*env).noBypass)
		}},
		{name: "short store timeout, burst", na: net, run: func(t *testing.T, c cell) {
			e := newEnv(t, c, envOpts{h: holding(20 * time.Millisecond), storeTimeout: 60 * time.Millisecond,
				route: func(rc *idempotency.RouteConfig) { rc.TxLockWait = 5 * time.Millisecond }})
			e.burst(48, (*env).noBypassWithoutProbe)
		}},
	}
}

// holding is record after d, so a transactional route holds its
// connection that long.
func holding(d time.Duration) behaviour {
	return func(ctx context.Context, h *hctx) (int, []byte) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return record(ctx, h)
	}
}

// runPoolBusy takes every connection of the store's pool, sends a call,
// then gives them back and retries.
func runPoolBusy(t *testing.T, c cell) {
	e := newEnv(t, c, envOpts{})
	release := e.takePool()
	key := newKey()
	a := e.send(key)
	release()
	e.expect("call on a busy pool", a, "idempotency_store_unavailable")
	e.within("call on a busy pool", a, 0)
	if n := e.started(key); n != 0 {
		e.failf("the handler ran %d times on a busy pool", n)
	}
	e.wantReason("pool_exhausted")
	e.noBypass()
	again := e.sendUnrun(key)
	e.expect("retry on a free pool", again, "")
	e.atMostOnce(key, 1)
}

// wantReason checks that a call was refused under the store reason
// (Observation.StoreReason, the metrics' label): every wait on the pool is
// pool_exhausted, however it surfaced ("A bypass needs a dial that
// failed").
func (e *env) wantReason(reason string) {
	e.t.Helper()
	e.mu.Lock()
	n := e.reasons["rejected:store_unavailable/"+reason]
	e.mu.Unlock()
	if n == 0 {
		e.failf("no call was refused with the store reason %s", reason)
	}
}

// takePool holds every connection of the store's pool until the returned
// function runs.
func (e *env) takePool() func() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var held []func()
	for range e.se.max {
		switch {
		case e.se.pgPool != nil:
			conn, err := e.se.pgPool.Acquire(ctx)
			if err != nil {
				e.t.Fatalf("take the pool: %v", err)
			}
			held = append(held, conn.Release)
		default:
			conn, err := e.se.sqlPool.Conn(ctx)
			if err != nil {
				e.t.Fatalf("take the pool: %v", err)
			}
			held = append(held, func() { _ = conn.Close() })
		}
	}
	return func() {
		for _, f := range held {
			f()
		}
	}
}

// emptyPool closes the store pool's idle connections, so the next calls
// find it opening connections.
func (e *env) emptyPool() {
	switch {
	case e.se.pgPool != nil:
		e.se.pgPool.Reset()
	default:
		e.se.sqlPool.SetMaxIdleConns(0)
		e.se.sqlPool.SetMaxIdleConns(2)
	}
}

// burst sends n calls with new keys at once: each answers the handler's
// success or 503, none runs twice, and bypasses pass check (the database
// is healthy).
func (e *env) burst(n int, check func(*env)) {
	keys := make([]string, n)
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		keys[i] = newKey()
		wg.Go(func() {
			<-start
			answers[i] = e.send(keys[i])
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, a := range answers {
		switch {
		case a.err == nil && a.handler && a.status < 300:
			ok++
		case a.code == "idempotency_store_unavailable":
		default:
			e.failf("burst call %d: want the handler's answer or idempotency_store_unavailable, got %v", i, a)
		}
		e.within(fmt.Sprintf("burst call %d", i), a, time.Second)
		e.atMostOnce(keys[i], -1)
	}
	check(e)
	e.t.Logf("burst: %d of %d executed", ok, n)
}
