// Package probe shares one store's outage probe among the requests that
// need its verdict (DESIGN-settled-r4 item 4): at most one probe runs per
// store at a time, every request that asks while it runs gets its
// verdict, and a verdict is reused for at most Reuse after it came. A
// database that is recovering then gets one new connection per store per
// second from the probes, not one per failing request.
package probe

import (
	"context"
	"sync"
	"time"
)

// Reuse is how long a verdict serves the requests that ask after it came.
const Reuse = time.Second

// Gate runs one probe at a time and shares its verdict. The zero Gate is
// ready to use; it is safe for concurrent use.
type Gate struct {
	mu      sync.Mutex
	running *verdict // the probe running now, nil when none is
	last    *verdict // the last verdict that came, nil before the first
}

// verdict is one probe's result: err is set before done is closed.
type verdict struct {
	done chan struct{}
	err  error
	at   time.Time // when it came
}

// Do returns a verdict of probe: the last one if it came less than Reuse
// ago, else that of the probe running now, else that of a new run of probe
// under ctx, its deadline brought forward by a tenth of the time left. A
// caller whose ctx ends while it waits for another caller's probe gets
// ctx's error, never a verdict.
func (g *Gate) Do(ctx context.Context, probe func(context.Context) error) error {
	g.mu.Lock()
	if l := g.last; l != nil && time.Since(l.at) < Reuse {
		g.mu.Unlock()
		return l.err
	}
	if v := g.running; v != nil {
		g.mu.Unlock()
		select {
		case <-v.done:
			return v.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	v := &verdict{done: make(chan struct{})}
	g.running = v
	g.mu.Unlock()
	defer func() { // also when probe panics: the waiters must not wait for ever
		g.mu.Lock()
		v.at = time.Now()
		g.running, g.last = nil, v
		g.mu.Unlock()
		close(v.done)
	}()
	pctx, cancel := shortened(ctx)
	defer cancel()
	v.err = probe(pctx)
	return v.err
}

// shortened is ctx with a tenth of its time left taken off its deadline:
// the callers that join a probe a moment after it began, with the same
// bound (the store timeout), then get its verdict before their own
// deadlines end their wait.
func shortened(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, d.Add(-time.Until(d)/10))
}
