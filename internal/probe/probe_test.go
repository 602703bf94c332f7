package probe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOneProbeServesEveryWaiter: callers that ask while a probe runs get
// its verdict; none starts a second one.
func TestOneProbeServesEveryWaiter(t *testing.T) {
	t.Parallel()
	var g Gate
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	failed := errors.New("refused")
	probe := func(context.Context) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- g.Do(ctx, probe) }()
	<-started
	for range 19 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- g.Do(ctx, probe) }()
	}
	// The waiters are blocked on the running probe or will find its
	// verdict reused: either way no second probe runs.
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, failed) {
			t.Errorf("verdict %v, want the probe's", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d probes ran, want 1", n)
	}
}

// TestVerdictReusedForAtMostReuse: a verdict serves the callers of the
// next Reuse, then a new probe runs.
func TestVerdictReusedForAtMostReuse(t *testing.T) {
	t.Parallel()
	var g Gate
	var runs atomic.Int32
	probe := func(context.Context) error { runs.Add(1); return nil }
	for range 3 {
		if err := g.Do(context.Background(), probe); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d probes within Reuse, want 1", n)
	}
	g.mu.Lock()
	g.last.at = time.Now().Add(-Reuse) // the verdict's time has run out
	g.mu.Unlock()
	if err := g.Do(context.Background(), probe); err != nil || runs.Load() != 2 {
		t.Fatalf("after Reuse: %v, %d probes; want a second probe", err, runs.Load())
	}
}

// TestWaiterBoundedByItsContext: a caller waiting for another's probe
// returns when its own context ends.
func TestWaiterBoundedByItsContext(t *testing.T) {
	t.Parallel()
	var g Gate
	release, started := make(chan struct{}), make(chan struct{})
	go g.Do(context.Background(), func(context.Context) error { close(started); <-release; return nil })
	<-started
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Do(ctx, func(context.Context) error { return nil }) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter: %v, want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("TestWaiterBoundedByItsContext: the waiter did not return at its deadline")
	}
}

// TestJoinersGetTheVerdictInTime: callers that join a probe a moment
// after it began, each bounded as it is, get its verdict, not their own
// deadline: the probe runs under a deadline brought forward.
func TestJoinersGetTheVerdictInTime(t *testing.T) {
	t.Parallel()
	var g Gate
	const bound = 200 * time.Millisecond
	started := make(chan struct{})
	failed := errors.New("no answer")
	probe := func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // a black hole: no answer within the bound
		return failed
	}
	lctx, lcancel := context.WithTimeout(context.Background(), bound)
	defer lcancel()
	errs := make(chan error, 9)
	go func() { errs <- g.Do(lctx, probe) }()
	<-started
	for range 8 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			errs <- g.Do(ctx, probe)
		}()
	}
	for range 9 {
		if err := <-errs; !errors.Is(err, failed) {
			t.Errorf("verdict %v, want the probe's", err)
		}
	}
}
