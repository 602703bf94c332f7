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

// contends reports whether a claim found its key contended (others kept
// winning it, or the store's retries ran out on conflicts): owned by
// someone, so a duplicate on a route with WaitInFlight waits for it as for
// a row it saw in flight.
func (rq *request) contends(res claimed, err error) bool {
	if rq.policy.waitInFlight == 0 || rq.policy.txStore != nil {
		return false
	}
	return err == nil && res.outcome == claimContended || err != nil && storeReason(err) == ReasonConflict
}

// awaitOutcome waits, at most the route's WaitInFlight and while the
// caller's context lasts, for the owner of rec (zero: of whichever row the
// key holds) to settle it, and returns the key as it then stands: settled
// (the duplicate answers it), freed and won by this call (it runs), or
// contended (409 in flight) when the wait ran out. Each re-read is the
// claim again, under the store timeout; the waiter is registered (watchRow)
// before each one, so a wake-up between two reads is never missed. A store
// error while waiting answers in flight on every policy: the key was seen
// owned, so a bypass would run beside its owner.
func (rq *request) awaitOutcome(rec Record) (claimed, error) {
	wake, stop := watchRow(rq.m.store, rec.ID)
	defer func() { stop() }()
	since := time.Now() // when this waiter registered
	deadline := time.NewTimer(rq.policy.waitInFlight)
	defer deadline.Stop()
	poll := time.NewTicker(waitPoll)
	defer poll.Stop()
	for {
		start := time.Now()
		res, own, err := rq.reread(since)
		now := claimed{outcome: claimDuplicate, record: res.Record}
		switch {
		case err != nil && storeReason(err) == ReasonUnseal:
			return claimed{}, err // 503 on every policy, as for the first read
		case err != nil && storeReason(err) != ReasonConflict:
			rq.logClaimFailure(slog.LevelWarn, "idempotency: the store failed while a duplicate waited for the key's owner; answering in flight",
				storeReason(err), err)
			return claimed{outcome: claimContended}, nil
		case err != nil: // contention: the key is still owned
		case res.Won && !own:
			// Another waiter's read won the freed key: wait for its outcome.
		case res.Won:
			return claimed{outcome: claimWon, record: res.Record, claimedAt: start}, nil
		case !rq.waits(now):
			return now, nil
		case res.Record.ID != rec.ID:
			// Another row to wait for (the first one seen, or a takeover's):
			// registered before it is read again.
			rec = res.Record
			stop()
			wake, stop = watchRow(rq.m.store, rec.ID)
			since = time.Now()
			continue
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

// rereads coalesces the re-reads of the duplicates of one request (key,
// scope, endpoint, hash) waiting in this process: one claim answers every
// waiter registered before it began, so a storm of duplicates costs one
// read per wake-up or poll, not one per duplicate.
type rereads struct {
	mu       sync.Mutex
	inFlight map[rereadKey]*reread
}

type rereadKey struct{ key, scope, endpoint, hash string }

// reread is one coalesced claim: its result once done is closed.
type reread struct {
	began time.Time
	done  chan struct{}
	res   ClaimResult
	err   error
}

// reread claims the request's key again, or shares the result of a claim
// of the same request that began after since (the waiter's registration):
// own reports that this call's claim (its owner token) made it.
func (rq *request) reread(since time.Time) (res ClaimResult, own bool, err error) {
	rr, k := &rq.m.rereads, rereadKey{rq.claim.Key, rq.claim.Scope, rq.claim.Endpoint, rq.claim.RequestHash}
	for {
		rr.mu.Lock()
		r := rr.inFlight[k]
		if r == nil {
			break // the lock is held: this call leads
		}
		rr.mu.Unlock()
		<-r.done
		if r.began.After(since) {
			return r.res, false, r.err
		}
		// Begun before this waiter registered: it may have missed the
		// outcome this waiter was woken for. Read again.
	}
	if rr.inFlight == nil {
		rr.inFlight = make(map[rereadKey]*reread)
	}
	r := &reread{began: time.Now(), done: make(chan struct{})}
	rr.inFlight[k] = r
	rr.mu.Unlock()
	r.res, r.err = rq.storeClaim("claim", rq.m.store.Claim)
	rr.mu.Lock()
	delete(rr.inFlight, k)
	rr.mu.Unlock()
	close(r.done)
	return r.res, true, r.err
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
