package result

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is how one request (or, for sqlfloor, one operation) ended.
type Outcome uint8

// The outcomes. Only OK counts towards throughput and latency; any other
// fails the run.
const (
	OK         Outcome = iota // the answer the mode expects
	Unexpected                // an answer, but not one the mode expects
	Failed                    // no answer: a transport or SQL error
)

// Sample is one request of a load.
type Sample struct {
	Start, Done time.Time // set by Load.Run
	Outcome     Outcome
	Status      int   // HTTP status; 0 when there is none
	Replayed    bool  // the answer was a replay
	Err         error // with Failed: what went wrong
}

// Load is a closed loop: each of Workers sends a request, waits for its
// end, and sends the next. It runs for Warmup (with a Warmup, each worker
// sends at least one warm-up request, however late it starts); then, once
// every warm-up request has ended (none straddles the window's start), the
// measured window starts, and measured requests are sent until the window
// has lasted Duration or, with Requests, until that many were sent.
type Load struct {
	Workers  int
	Warmup   time.Duration
	Duration time.Duration
	Requests int64 // measured requests to send at most; 0: no cap
	// AtStart, when set, runs between the warm-up and the window, with no
	// request in flight (a counter read there sees no warm-up request's
	// work to come).
	AtStart func()
	// AtEnd, when set and Requests is 0, runs when the window ends, with the
	// window's last requests still in flight. When Run returns, AtEnd has
	// either run to its end or will never run (the load was cancelled
	// first).
	AtEnd func()
}

// Run is what a Load did.
type Run struct {
	// From and End are the measured window: End is From plus Duration, or,
	// when Requests were sent before that, the end of the last of them.
	From, End time.Time
	// Samples are the measured requests, every one ended: those ending
	// after End included (they count for Sent and for failures, not for
	// throughput or latency).
	Samples []Sample
	// WarmupUnexpected and WarmupFailed count the warm-up's requests that
	// did not end OK.
	WarmupUnexpected, WarmupFailed int64
	// LastErr is the last error of a Failed request, warm-up included.
	LastErr error
}

// Run drives the load with op, which sends one request and reports how it
// ended (Run sets Start and Done). It returns when every worker has
// stopped: at the window's end, after Requests, or when ctx is done.
func (l Load) Run(ctx context.Context, op func(context.Context) Sample) Run {
	var (
		r          Run
		mu         sync.Mutex
		warm, wg   sync.WaitGroup
		started    atomic.Int64
		warmUnexp  atomic.Int64
		warmFailed atomic.Int64
	)
	gate := make(chan struct{})
	warmEnd := time.Now().Add(l.Warmup)
	var end time.Time // written before gate closes
	noteErr := func(err error) {
		mu.Lock()
		r.LastErr = err
		mu.Unlock()
	}
	for range l.Workers {
		warm.Add(1)
		wg.Go(func() {
			for first := l.Warmup > 0; (first || time.Now().Before(warmEnd)) && ctx.Err() == nil; first = false {
				switch s := op(ctx); s.Outcome {
				case Unexpected:
					warmUnexp.Add(1)
				case Failed:
					warmFailed.Add(1)
					noteErr(s.Err)
				}
			}
			warm.Done()
			select {
			case <-gate:
			case <-ctx.Done():
				return
			}
			var mine []Sample
			defer func() {
				mu.Lock()
				r.Samples = append(r.Samples, mine...)
				mu.Unlock()
			}()
			for {
				now := time.Now()
				if ctx.Err() != nil || !now.Before(end) {
					return
				}
				if l.Requests > 0 && started.Add(1) > l.Requests {
					return
				}
				s := op(ctx)
				s.Start, s.Done = now, time.Now()
				if s.Outcome == Failed {
					noteErr(s.Err)
				}
				mine = append(mine, s)
			}
		})
	}
	warm.Wait()
	if l.AtStart != nil && ctx.Err() == nil {
		l.AtStart()
	}
	r.From = time.Now()
	end = r.From.Add(l.Duration)
	var atEnd *time.Timer
	atEndDone := make(chan struct{})
	if l.AtEnd != nil && l.Requests == 0 {
		atEnd = time.AfterFunc(l.Duration, func() {
			defer close(atEndDone)
			l.AtEnd()
		})
	}
	close(gate)
	wg.Wait()
	if atEnd != nil {
		if atEnd.Stop() {
			if ctx.Err() == nil {
				// The workers saw the window's end before the timer fired
				// (both count l.Duration, from moments apart): AtEnd runs
				// now, as promised, instead of never.
				l.AtEnd()
			}
		} else {
			<-atEndDone // it fired: let it finish
		}
	}
	r.WarmupUnexpected, r.WarmupFailed = warmUnexp.Load(), warmFailed.Load()
	r.End = end
	if l.Requests > 0 && int64(len(r.Samples)) >= l.Requests {
		r.End = r.From
		for _, s := range r.Samples {
			if s.Done.After(r.End) {
				r.End = s.Done
			}
		}
	}
	return r
}

// Sent is the number of measured requests sent, every one ended.
func (r Run) Sent() int64 { return int64(len(r.Samples)) }

// Fill sets s's counts, throughput and latencies from r. Only the
// requests that ended OK inside the window count as requests, for
// throughput and latency; Status and Replayed count every request that
// ended inside the window; Errors and Unexpected count every request that
// did not end OK, in the warm-up, the window, or after the window's end.
func (r Run) Fill(s *Summary) {
	var lat Latencies
	s.Requests, s.Replayed = 0, 0
	s.Errors, s.Unexpected = r.WarmupFailed, r.WarmupUnexpected
	for _, x := range r.Samples {
		switch x.Outcome {
		case Unexpected:
			s.Unexpected++
		case Failed:
			s.Errors++
		}
		if x.Done.After(r.End) {
			continue
		}
		if x.Status != 0 {
			if s.Status == nil {
				s.Status = map[string]int64{}
			}
			s.Status[strconv.Itoa(x.Status)]++
		}
		if x.Replayed {
			s.Replayed++
		}
		if x.Outcome == OK {
			s.Requests++
			lat = append(lat, x.Done.Sub(x.Start))
		}
	}
	window := r.End.Sub(r.From)
	s.DurationS = window.Seconds()
	s.RPS = 0
	if window > 0 {
		s.RPS = float64(s.Requests) / window.Seconds()
	}
	lat.Fill(s)
}
