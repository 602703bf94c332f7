package main

import (
	"fmt"
	"sync"
	"time"
)

// The venue's faults (the package comment says what each does).
const (
	faultNone        = ""
	faultDrop        = "drop"
	faultDelay       = "delay"
	fault5xx         = "5xx"
	faultCrashBefore = "crash-before"
	faultCrashAfter  = "crash-after"
)

// faultSetting is the faults' JSON form, for the control endpoint and the
// flags: durations in Go syntax.
type faultSetting struct {
	Fault string `json:"fault"`
	Count int    `json:"count"` // orders left to hit; 0: every order
	Delay string `json:"delay,omitempty"`
	Hold  string `json:"hold,omitempty"`
}

// faults is the fault in force: what it is, how many more orders it hits,
// and the durations it needs.
type faults struct {
	fault string
	count int
	delay time.Duration
	hold  time.Duration
}

// parseFaults checks a setting: a known fault, a count >= 0, durations in Go
// syntax (empty: 0).
func parseFaults(s faultSetting) (faults, error) {
	switch s.Fault {
	case faultNone, faultDrop, faultDelay, fault5xx, faultCrashBefore, faultCrashAfter:
	default:
		return faults{}, fmt.Errorf("unknown fault %q: want drop, delay, 5xx, crash-before, crash-after or empty", s.Fault)
	}
	if s.Count < 0 {
		return faults{}, fmt.Errorf("fault count must be >= 0, got %d", s.Count)
	}
	f := faults{fault: s.Fault, count: s.Count}
	for _, d := range []struct {
		name, text string
		dst        *time.Duration
	}{{"delay", s.Delay, &f.delay}, {"hold", s.Hold, &f.hold}} {
		if d.text == "" {
			continue
		}
		v, err := time.ParseDuration(d.text)
		if err != nil || v < 0 {
			return faults{}, fmt.Errorf("%s %q: want a duration >= 0 such as 300ms or 2s", d.name, d.text)
		}
		*d.dst = v
	}
	return f, nil
}

// setting is f's JSON form.
func (f faults) setting() faultSetting {
	return faultSetting{Fault: f.fault, Count: f.count, Delay: f.delay.String(), Hold: f.hold.String()}
}

// faultBox holds the faults in force, switched by the control endpoint
// while orders run.
type faultBox struct {
	mu      sync.Mutex
	f       faults
	release chan struct{} // closed by the next set: held orders go on
}

func (b *faultBox) get() faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f
}

// set replaces the faults and releases the orders held so far.
func (b *faultBox) set(f faults) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.f = f
	if b.release != nil {
		close(b.release)
	}
	b.release = make(chan struct{})
}

// hold is how long an order waits before anything else, and the channel
// that ends the wait early.
func (b *faultBox) hold() (time.Duration, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.hold, b.release
}

// take returns the fault that hits this order, if it is one of kinds, with
// its delay, and counts it: the last order of a counted fault switches it
// off.
func (b *faultBox) take(kinds ...string) (string, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range kinds {
		if b.f.fault != k {
			continue
		}
		delay := b.f.delay
		if b.f.count > 0 {
			b.f.count--
			if b.f.count == 0 {
				b.f = faults{hold: b.f.hold}
			}
		}
		return k, delay
	}
	return faultNone, 0
}
