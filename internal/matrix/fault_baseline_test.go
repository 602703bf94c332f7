//go:build matrix

package matrix

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// The healthy baseline: a new key executes once, its retry replays, and
// concurrent duplicates of a key run it once. Every keyed answer they see
// advertises the row's expiry (Idempotency-Expires and its RPC and Do
// forms), but a transactional in-flight answer, which saw no row.
func baselineFaults() []*fault {
	return []*fault{
		simple("baseline: new key, replay", nil, envOpts{}, func(e *env) {
			key := newKey()
			first := e.sendUnrun(key)
			e.expect("first call", first, "")
			e.within("first call", first, 0)
			again := e.send(key)
			e.expect("retry", again, "")
			if again.err == nil && !again.replayed {
				e.failf("retry: want a replay, got %v", again)
			}
			if again.handler && first.handler && !bytes.Contains(again.body, []byte(key)) {
				e.failf("retry: replayed body %q is not the first answer's %q", again.body, first.body)
			}
			e.within("retry", again, 0)
			if first.err == nil && again.err == nil {
				e.advertises("first call", first, key)
				e.advertises("retry", again, key)
			}
			e.atMostOnce(key, 1)
			e.noBypass()
		}),
		concurrentDuplicates(),
	}
}

// concurrentDuplicates sends 8 calls with one key at once; the handler
// holds its claim until the others have answered (or 2 s passed), so they
// meet it in flight.
func concurrentDuplicates() *fault {
	const n = 8
	var mu sync.Mutex
	gates := map[string]chan struct{}{}
	gate := func(key string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[key] == nil {
			gates[key] = make(chan struct{})
		}
		return gates[key]
	}
	hold := func(ctx context.Context, h *hctx) (int, []byte) {
		select {
		case <-gate(h.key):
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return record(ctx, h)
	}
	return simple("baseline: concurrent dups", nil, envOpts{h: hold, storeOpts: storeOpts{maxConns: n + 2}}, func(e *env) {
		key := newKey()
		answers := make([]answer, n)
		returned := make(chan struct{}, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				answers[i] = e.send(key)
				returned <- struct{}{}
			})
		}
		for range n - 1 { // the one that runs does not return before the gate opens
			<-returned
		}
		close(gate(key))
		wg.Wait()
		won := 0
		for i, a := range answers {
			switch {
			case a.handler && a.status < 300:
				if !a.replayed {
					won++
				}
				if a.replayed || e.bypassed.Load() == 0 { // a bypass has no row to advertise
					e.advertises(fmt.Sprintf("duplicate %d", i), a, key)
				}
			case a.code == "idempotency_in_flight" && !e.c.v.tx:
				e.advertises(fmt.Sprintf("duplicate %d, in flight", i), a, key) // it read the owner's committed row
			case a.code == "idempotency_in_flight":
				if !a.expires.IsZero() { // it waited on the owner's uncommitted row: none to read
					e.failf("duplicate %d: a transactional in-flight answer advertises the expiry %v", i, a.expires)
				}
			case a.code == "idempotency_store_unavailable":
				// A store slower than its timeout (a loaded CI machine,
				// an InnoDB lock wait in whole seconds) is a 503, never a
				// second execution; noBypass and atMostOnce still hold.
			default:
				e.failf("duplicate %d: want the handler's answer, a replay, idempotency_in_flight or _store_unavailable, got %v", i, a)
			}
			e.within("duplicate", a, time.Second)
		}
		if won > 1 {
			e.failf("%d of %d duplicates got a fresh handler answer, want at most 1", won, n)
		}
		e.atMostOnce(key, won) // all 503 on a slow store: none ran
		e.noBypass()
	})
}
