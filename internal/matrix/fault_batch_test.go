//go:build matrix

package matrix

import (
	"fmt"
	"sync"
	"time"
)

// Group commit (issue #37): on the pgx store with one batch slot (the
// default) and with two (the setting for a disk that flushes fast), six new
// keys sent three times each, all at once, queue behind the busy slots and
// share batches of claims and records. Each key runs at most once; every
// call gets the handler's answer, a replay, 409 in flight or a 503; a retry
// of each key then replays the answer that ran (or runs the key, when every
// call of it was a 503).

const (
	naBatchStore = "group commit is the pgx store's: sqlstore and MySQL claim one key per statement (settled-r4 item 26)"
	naBatchTx    = "a transactional route claims inside its own transaction: no batching across transactions"
)

// batchStoreTimeout is the cells' store timeout: eighteen calls at once on
// six connections, on a loaded CI machine, are answered by the store, not
// by their deadlines.
const batchStoreTimeout = time.Second

func batchFaults() []*fault { return []*fault{batchFault(1), batchFault(2)} }

func batchFault(slots int) *fault {
	na := func(c column) string {
		switch {
		case c.store != storePgx:
			return naBatchStore
		case c.v.tx:
			return naBatchTx
		}
		return ""
	}
	const keys, copies = 6, 3
	name := "group commit: new keys and duplicates in batches"
	if slots > 1 {
		name += fmt.Sprintf(", %d slots", slots)
	}
	return simple(name, na, envOpts{storeTimeout: batchStoreTimeout, storeOpts: storeOpts{maxConns: 6, batchSlots: slots}}, func(e *env) {
		ks := make([]string, keys)
		for i := range ks {
			ks[i] = newKey()
		}
		answers := make([][]answer, keys)
		for i := range answers {
			answers[i] = make([]answer, copies)
		}
		var wg sync.WaitGroup
		for i := range keys * copies {
			wg.Go(func() { answers[i%keys][i/keys] = e.send(ks[i%keys]) })
		}
		wg.Wait()
		for k, key := range ks {
			won := 0
			for j, a := range answers[k] {
				switch {
				case a.handler && a.status < 300:
					if !a.replayed {
						won++
					}
				case a.code == "idempotency_in_flight", a.code == "idempotency_store_unavailable":
				default:
					e.failf("key %d, call %d: want the handler's answer, a replay, in flight or unavailable, got %v", k, j, a)
				}
				e.within(fmt.Sprintf("key %d, call %d", k, j), a, 0)
			}
			if won > 1 {
				e.failf("key %d: %d fresh handler answers, want at most 1", k, won)
			}
			e.atMostOnce(key, won)
			again := e.send(key)
			e.expect(fmt.Sprintf("key %d, retry", k), again, "")
			if won == 1 && again.err == nil && !again.replayed {
				e.failf("key %d, retry: want a replay, got %v", k, again)
			}
		}
		e.noBypass()
	})
}
