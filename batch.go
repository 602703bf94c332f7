package idempotency

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit: the claims, and the records, of concurrent calls on
// ordinary routes share one statement and one commit (pgsql.ClaimBatchSQL,
// pgsql.CompleteBatchSQL). A call that finds one of the store's batch slots
// free runs alone at once, as without batching, so a lone call never waits;
// calls arriving while every slot is busy queue, and the next slot to free
// takes up to the cap of them as one batch. Every claim is durable before
// its caller's handler runs, every record before its answer.

// Group commit's defaults (PostgresStore.SetBatching), chosen by
// bench/groupcommit.sh (BENCHMARKS.md "Group commit").
const (
	defaultBatchMax         = 32
	defaultBatchConcurrency = 2
)

// batching is a store's group commit settings and queues.
type batching struct {
	max, slots int
	claims     batchGate[*claimCall]
	records    batchGate[*recordCall]
}

// SetBatching sets group commit before use: max calls share a statement and
// commit, concurrency batches in flight (defaults 32, 2; max 1: off).
func (s *PostgresStore) SetBatching(max, concurrency int) {
	if max <= 1 || concurrency < 1 {
		s.batch.Store(nil)
		return
	}
	s.batch.Store(&batching{max: max, slots: concurrency})
}

// batchGate is one kind of call's queue and its busy slots.
type batchGate[C queued] struct {
	mu    sync.Mutex
	queue []C
	busy  int
}

// take takes a free slot when no call is queued (true: the caller runs
// alone now); a lone call allocates nothing to be batched.
func (g *batchGate[C]) take(slots int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy < slots && len(g.queue) == 0 {
		g.busy++
		return true
	}
	return false
}

// enter takes a free slot (true: the caller runs alone now) or queues c.
func (g *batchGate[C]) enter(c C, slots int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy < slots && len(g.queue) == 0 {
		g.busy++
		return true
	}
	g.queue = append(g.queue, c)
	return false
}

// next hands a slot holder the next batch, up to max calls, or frees its
// slot when none is queued (nil).
func (g *batchGate[C]) next(max int) []C {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.busy--
		return nil
	}
	n := min(max, len(g.queue))
	b := slices.Clone(g.queue[:n])
	g.queue = append(g.queue[:0], g.queue[n:]...)
	return b
}

// leave takes c out of the queue, if it is still there.
func (g *batchGate[C]) leave(c C) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.queue, c); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
	}
}

// handOn runs the batches queued behind a slot holder that has finished, in
// a goroutine of their own, until the queue is empty and the slot free.
func handOn[C queued](g *batchGate[C], max int, run func([]C)) {
	b := g.next(max)
	if b == nil {
		return
	}
	go func() {
		for ; b != nil; b = g.next(max) {
			run(b)
		}
	}()
}

// batchContext is a batch's context: the latest deadline among its calls'
// (no deadline if one has none), not cancelled with any of them: a caller
// that gives up leaves the others' statement running.
func batchContext[C queued](calls []C) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range calls {
		d, ok := c.call().ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.Background(), last)
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

// waitBatched waits for a queued call's answer (nil, false). A call still
// unsent at half its deadline's remaining time leaves the queue for the
// caller to send alone (nil, true): a slot busy that long is held by a
// statement without a reply, and the call then meets the outage itself
// (its own timeout, the outage probe) rather than reading as saturation.
// A caller that ends first withdraws an unsent call, or, when it was sent,
// is answered as a call whose reply never came.
func waitBatched[C queued](ctx context.Context, g *batchGate[C], c C) (alone bool, err error) {
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
				g.leave(c)
				return true, nil
			}
		case <-ctx.Done():
			if bc.withdraw() {
				g.leave(c)
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
