package idempotency

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit: the claims and the records of concurrent calls on ordinary
// routes share one round trip and one commit (pgsql.ClaimBatchSQL, then
// pgsql.CompleteBatchSQL, in one transaction). A call that finds one of the
// store's batch slots free runs alone at once, as without batching, so a
// lone call never waits; calls arriving while every slot is busy queue,
// and the next slot to free takes up to the cap of each kind as one round.
// Every claim is durable before its caller's handler runs, every record
// before its answer.

// Group commit's defaults (PostgresStore.SetBatching), chosen by
// bench/groupcommit.sh (BENCHMARKS.md "Group commit", "The default slot
// count"). One slot: a round leaves when the one before it returned, so a
// round carries every call that arrived meanwhile. A second slot measured
// slower on four of the five machines that ran both (its round waits on
// the first's WAL flush, and a free slot lets calls through alone, each
// its own commit); it pays only where the flush is fast.
const (
	defaultBatchMax         = 32
	defaultBatchConcurrency = 1
)

// batching is a store's group commit settings and its round gate.
type batching struct {
	max, slots int
	gate       roundGate
}

// SetBatching sets group commit before use: max calls of each kind share a
// statement and commit, concurrency rounds in flight (defaults 32, 1; max
// 1: off). A second slot suits a database whose commits flush fast (local
// NVMe) and few concurrent callers: docs/production.md, "Group commit".
func (s *PostgresStore) SetBatching(max, concurrency int) {
	if max <= 1 || concurrency < 1 {
		s.batch.Store(nil)
		return
	}
	s.batch.Store(&batching{max: max, slots: concurrency})
}

// roundGate is the queued claims and records and the busy slots. A slot
// holder that finishes takes the next round: up to the cap of each kind,
// sent together in one transaction.
type roundGate struct {
	mu      sync.Mutex
	busy    int
	claims  []*claimCall
	records []*recordCall
}

// idle reports a free slot and nothing queued (g.mu held).
func (g *roundGate) idle(slots int) bool {
	return g.busy < slots && len(g.claims) == 0 && len(g.records) == 0
}

// take takes a free slot when no call is queued (true: the caller runs
// alone now); a lone call allocates nothing to be batched.
func (g *roundGate) take(slots int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle(slots) {
		g.busy++
		return true
	}
	return false
}

// enter takes a free slot of g (true: the caller runs alone now) or
// queues c on q, one of g's queues.
func enter[C any](g *roundGate, q *[]C, c C, slots int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle(slots) {
		g.busy++
		return true
	}
	*q = append(*q, c)
	return false
}

// leave takes c out of q, one of g's queues, if it is still there.
func leave[C comparable](g *roundGate, q *[]C, c C) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(*q, c); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
	}
}

// next hands a slot holder the next round, up to max calls of each kind,
// or frees its slot when none is queued (false).
func (g *roundGate) next(max int) (claims []*claimCall, records []*recordCall, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.claims) == 0 && len(g.records) == 0 {
		g.busy--
		return nil, nil, false
	}
	return cut(&g.claims, max), cut(&g.records, max), true
}

// cut takes up to max calls off the front of q.
func cut[C any](q *[]C, max int) []C {
	n := min(max, len(*q))
	if n == 0 {
		return nil
	}
	b := slices.Clone((*q)[:n])
	*q = append((*q)[:0], (*q)[n:]...)
	return b
}

// handOn runs the rounds queued behind a slot holder that has finished, in
// a goroutine of their own, until the queues are empty and the slot free.
func (g *roundGate) handOn(max int, run func([]*claimCall, []*recordCall)) {
	c, r, ok := g.next(max)
	if !ok {
		return
	}
	go func() {
		for ; ok; c, r, ok = g.next(max) {
			run(c, r)
		}
	}()
}

// roundDeadline is a round's deadline: the latest among its calls' (none
// if one has none).
type roundDeadline struct {
	last time.Time
	none bool
}

// addDeadlines takes calls' deadlines into d.
func addDeadlines[C queued](d *roundDeadline, calls []C) {
	for _, c := range calls {
		t, ok := c.call().ctx.Deadline()
		switch {
		case !ok:
			d.none = true
		case t.After(d.last):
			d.last = t
		}
	}
}

// context is the round's context, not cancelled with any of its calls': a
// caller that gives up leaves the others' statements running.
func (d roundDeadline) context() (context.Context, context.CancelFunc) {
	if d.none {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), d.last)
}

// firsts splits calls into the first call for each row, as same tells
// rows apart, and the later calls naming each first's row (rest[i] for
// batch[i]; rest is nil when no two calls share a row). A batch holds at
// most the cap of calls, so a scan beats a map's allocations.
func firsts[C any](calls []C, same func(a, b C) bool) (batch []C, rest [][]C) {
	batch = make([]C, 0, len(calls))
next:
	for _, c := range calls {
		for i, b := range batch {
			if same(b, c) {
				if rest == nil {
					rest = make([][]C, len(calls))
				}
				rest[i] = append(rest[i], c)
				continue next
			}
		}
		batch = append(batch, c)
	}
	return batch, rest
}

// batchable reports values a batch can carry (storable: text PostgreSQL
// can hold). The engine admits no other, but a Store is public: a value the
// database would refuse goes alone, so it never fails its neighbours.
func batchable(values ...string) bool {
	for _, v := range values {
		if !storable(v) {
			return false
		}
	}
	return true
}

// errBatchGaveUp is the cause of a batched call whose caller's deadline
// came while its batch was in flight.
var errBatchGaveUp = errors.New("the caller gave up while its batch was in flight")

// A queued call's states: pending (queued, or in a batch not yet sent),
// withdrawn by its caller before it was sent (the caller went alone or
// gave up), or sent (in a batch's statement, or claimed alone for it).
const (
	callPending int32 = iota
	callWithdrawn
	callSent
)

// batchCall is what every queued call carries: its caller's context and
// its state.
type batchCall struct {
	ctx   context.Context
	state atomic.Int32
	done  chan struct{}
}

// send marks a pending call sent; false if its caller withdrew it.
func (b *batchCall) send() bool {
	return b.state.CompareAndSwap(callPending, callSent) || b.state.Load() == callSent
}

// withdraw takes back a call not yet sent; false if it was sent.
func (b *batchCall) withdraw() bool { return b.state.CompareAndSwap(callPending, callWithdrawn) }

// queued is a call a batchGate holds.
type queued interface {
	comparable
	call() *batchCall
}

// waitBatched waits for a queued call's answer (nil, false); leave takes
// it out of its queue. A call still unsent at half its deadline's
// remaining time leaves the queue for the caller to send alone (nil,
// true): a slot busy that long is held by a statement without a reply, and
// the call then meets the outage itself (its own timeout, the outage
// probe) rather than reading as saturation. A caller that ends first
// withdraws an unsent call, or, when it was sent, is answered as a call
// whose reply never came.
func waitBatched[C queued](ctx context.Context, c C, leave func()) (alone bool, err error) {
	bc := c.call()
	var half <-chan time.Time
	if d, ok := ctx.Deadline(); ok {
		t := time.NewTimer(time.Until(d) / 2)
		defer t.Stop()
		half = t.C
	}
	for {
		select {
		case <-bc.done:
			return false, nil
		case <-half:
			half = nil
			if bc.withdraw() {
				leave()
				return true, nil
			}
		case <-ctx.Done():
			if bc.withdraw() {
				leave()
				return false, ctx.Err()
			}
			select {
			case <-bc.done:
				return false, nil
			default:
				return false, errors.Join(ctx.Err(), errBatchGaveUp)
			}
		}
	}
}
