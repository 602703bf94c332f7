package idempotency

// Duplicates that wait for the answer (RouteConfig.WaitInFlight): a
// duplicate of a key in flight re-reads the key until its owner settles,
// woken by the store (Store.Watch) and polling besides, holding no
// connection between reads.

import (
	"log/slog"
	"sync"
	"time"
)

// waitPoll is how often a waiting duplicate re-reads the key even unwoken,
// so that a lost wake-up costs at most one poll.
const waitPoll = 100 * time.Millisecond

// waits reports whether a duplicate may wait for the claim's row: a row in
// flight inside its lease, claimed for the same request (a mismatch
// answers 422 at once).
func (rq *request) waits(res claimed) bool {
	rec := &res.record
	return rq.policy.waitInFlight > 0 && res.outcome == claimDuplicate && rec.Status == StatusInFlight &&
		!rec.LeaseOver && rec.RequestHash == rq.claim.RequestHash
}

// awaitOutcome waits, at most the route's WaitInFlight and while the
// caller's context lasts, for the owner of rec to settle it, and returns
// the key as it then stands: settled (the duplicate answers it), freed and
// won by this call (it runs), or contended (409 in flight) when the wait
// ran out. Each re-read is the claim again, under the store timeout; the
// waiter is registered before each one, so a wake-up between two reads is
// never missed. A store error while waiting answers in flight on every
// policy: the row was seen in flight, so a bypass would run beside it.
func (rq *request) awaitOutcome(rec Record) (claimed, error) {
	wake, stop := rq.m.store.Watch(rec.ID)
	defer stop()
	deadline := time.NewTimer(rq.policy.waitInFlight)
	defer deadline.Stop()
	poll := time.NewTicker(waitPoll)
	defer poll.Stop()
	for {
		start := time.Now()
		res, err := rq.storeClaim("claim", rq.m.store.Claim)
		switch {
		case err != nil && storeReason(err) == ReasonUnseal:
			return claimed{}, err // 503 on every policy, as for the first read
		case err != nil:
			rq.logClaimFailure(slog.LevelWarn, "idempotency: the store failed while a duplicate waited for the key's owner; answering in flight",
				storeReason(err), err)
			return claimed{outcome: claimContended}, nil
		case res.Won:
			return claimed{outcome: claimWon, record: res.Record, claimedAt: start}, nil
		case res.Record.ID != rec.ID || !rq.waits(claimed{outcome: claimDuplicate, record: res.Record}):
			return claimed{outcome: claimDuplicate, record: res.Record}, nil
		}
		select {
		case <-wake:
		case <-poll.C:
		case <-deadline.C:
			return claimed{outcome: claimContended}, nil
		case <-rq.ctx.Done():
			return claimed{outcome: claimContended}, nil
		}
	}
}

// wakeups is a registry of waiters by row id, which a store wakes when a
// row's outcome lands. The zero value is empty and ready.
type wakeups struct {
	mu      sync.Mutex
	waiters map[int64]map[*waiter]struct{}
}

// waiter is one registered wait: its channel holds one wake-up.
type waiter struct{ ch chan struct{} }

// watch registers a waiter for row id (Store.Watch).
func (w *wakeups) watch(id int64) (<-chan struct{}, func()) {
	wt := &waiter{ch: make(chan struct{}, 1)}
	w.mu.Lock()
	if w.waiters == nil {
		w.waiters = make(map[int64]map[*waiter]struct{})
	}
	set := w.waiters[id]
	if set == nil {
		set = make(map[*waiter]struct{})
		w.waiters[id] = set
	}
	set[wt] = struct{}{}
	w.mu.Unlock()
	return wt.ch, func() {
		w.mu.Lock()
		if set := w.waiters[id]; set != nil {
			delete(set, wt)
			if len(set) == 0 {
				delete(w.waiters, id)
			}
		}
		w.mu.Unlock()
	}
}

// wake wakes every waiter of row id; a waiter already woken stays so.
func (w *wakeups) wake(id int64) {
	w.mu.Lock()
	for wt := range w.waiters[id] {
		wt.signal()
	}
	w.mu.Unlock()
}

// wakeAll wakes every waiter, after wake-ups may have been lost (a
// listener that reconnected).
func (w *wakeups) wakeAll() {
	w.mu.Lock()
	for _, set := range w.waiters {
		for wt := range set {
			wt.signal()
		}
	}
	w.mu.Unlock()
}

// count is the number of registered waiters (tests).
func (w *wakeups) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, set := range w.waiters {
		n += len(set)
	}
	return n
}

func (wt *waiter) signal() {
	select {
	case wt.ch <- struct{}{}:
	default:
	}
}
