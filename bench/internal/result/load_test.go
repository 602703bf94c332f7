package result

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestFillCountsOnlyOKInsideWindow: errors and unexpected answers never
// count as requests, so never as throughput, but always fail the run, warm-up
// and after-the-window included; a request ending after the window's end is
// out of throughput and latency.
func TestFillCountsOnlyOKInsideWindow(t *testing.T) {
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return from.Add(time.Duration(ms) * time.Millisecond) }
	r := Run{From: from, End: at(2000), WarmupFailed: 1, WarmupUnexpected: 2, Samples: []Sample{
		{Start: at(0), Done: at(10), Outcome: OK, Status: 201},
		{Start: at(10), Done: at(40), Outcome: OK, Status: 201},
		{Start: at(40), Done: at(60), Outcome: OK, Status: 201, Replayed: true},
		{Start: at(60), Done: at(70), Outcome: Unexpected, Status: 503},
		{Start: at(70), Done: at(80), Outcome: Failed, Err: errors.New("reset")},
		{Start: at(1990), Done: at(2500), Outcome: OK, Status: 201},         // ends after the window
		{Start: at(1995), Done: at(2100), Outcome: Unexpected, Status: 409}, // ends after the window
	}}
	var s Summary
	r.Fill(&s)
	if s.Requests != 3 || s.RPS != 1.5 || s.DurationS != 2 {
		t.Errorf("requests %d, rps %v in %vs; want 3, 1.5 in 2s", s.Requests, s.RPS, s.DurationS)
	}
	if s.Errors != 2 || s.Unexpected != 4 {
		t.Errorf("errors %d, unexpected %d; want 2 (1 in the warm-up), 4 (2 in the warm-up, 1 after the window)", s.Errors, s.Unexpected)
	}
	if s.Status["201"] != 3 || s.Status["503"] != 1 || s.Status["409"] != 0 || s.Replayed != 1 {
		t.Errorf("status %v, replayed %d; want 201: 3, 503: 1, 1 replayed", s.Status, s.Replayed)
	}
	// Latencies of the OK requests inside the window only: 10, 30, 20 ms.
	if s.P50Ms != 20 || s.MaxMs != 30 {
		t.Errorf("p50 %vms, max %vms; want 20, 30", s.P50Ms, s.MaxMs)
	}
}

// TestLoadWarmupEndsBeforeWindow: the window starts with no warm-up request
// in flight (AtStart sees none), and every measured request starts inside
// it.
func TestLoadWarmupEndsBeforeWindow(t *testing.T) {
	var inFlight, warmupOps atomic.Int64
	var atStart int64 = -1
	var gateOpen atomic.Bool
	l := Load{Workers: 4, Warmup: 30 * time.Millisecond, Duration: time.Minute, Requests: 40,
		AtStart: func() { atStart = inFlight.Load(); gateOpen.Store(true) }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // never hangs
	defer cancel()
	r := l.Run(ctx, func(context.Context) Sample {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		if !gateOpen.Load() {
			warmupOps.Add(1)
		}
		time.Sleep(time.Millisecond) // the request's work
		return Sample{Outcome: OK}
	})
	if atStart != 0 {
		t.Errorf("AtStart saw %d requests in flight, want 0", atStart)
	}
	if warmupOps.Load() == 0 {
		t.Error("no warm-up request ran")
	}
	if r.Sent() != 40 {
		t.Fatalf("%d measured requests, want 40", r.Sent())
	}
	for _, s := range r.Samples {
		if s.Start.Before(r.From) || s.Done.Before(s.Start) {
			t.Fatalf("a measured request ran %v to %v, the window starts at %v", s.Start, s.Done, r.From)
		}
		if s.Done.After(r.End) {
			t.Fatalf("a measured request ended at %v, after the window's end %v", s.Done, r.End)
		}
	}
}

// TestLoadRequestsCap: with Requests, exactly that many are sent, all
// count, and the window ends with the last of them.
func TestLoadRequestsCap(t *testing.T) {
	l := Load{Workers: 3, Duration: time.Minute, Requests: 7}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := l.Run(ctx, func(context.Context) Sample { return Sample{Outcome: OK, Status: 201} })
	if r.Sent() != 7 {
		t.Fatalf("sent %d, want 7", r.Sent())
	}
	var last time.Time
	for _, s := range r.Samples {
		if s.Done.After(last) {
			last = s.Done
		}
	}
	if !r.End.Equal(last) {
		t.Errorf("window ends %v, want the last request's end %v", r.End, last)
	}
	var s Summary
	r.Fill(&s)
	if s.Requests != 7 || s.Status["201"] != 7 {
		t.Errorf("requests %d, status %v; want 7", s.Requests, s.Status)
	}
}

// TestLoadAtEnd: AtEnd has run when Run returns after a full window, and
// the window is Duration long.
func TestLoadAtEnd(t *testing.T) {
	var ended atomic.Bool
	l := Load{Workers: 2, Duration: 20 * time.Millisecond, AtEnd: func() { ended.Store(true) }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := l.Run(ctx, func(context.Context) Sample {
		time.Sleep(time.Millisecond)
		return Sample{Outcome: OK}
	})
	if !ended.Load() {
		t.Error("AtEnd had not run when Run returned")
	}
	if got := r.End.Sub(r.From); got != l.Duration {
		t.Errorf("window %v, want %v", got, l.Duration)
	}
}

// TestLoadCancelled: a cancelled load returns, and AtEnd never runs later.
func TestLoadCancelled(t *testing.T) {
	var ended atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	l := Load{Workers: 2, Duration: time.Hour, AtEnd: func() { ended.Store(true) }}
	done := make(chan Run, 1)
	go func() {
		done <- l.Run(ctx, func(ctx context.Context) Sample {
			if calls.Add(1) == 5 {
				cancel()
			}
			return Sample{Outcome: OK}
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if ended.Load() {
		t.Error("AtEnd ran for a cancelled load")
	}
}
