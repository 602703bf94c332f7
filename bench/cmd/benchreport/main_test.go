package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/bench/internal/result"
)

// TestMedian: the middle value, the mean of the two middle ones for an
// even count, and the caller's slice left in its order.
func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{5, 5, 1}, 5},
	} {
		in := slices.Clone(c.in)
		if got := median(in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("median reordered its argument: %v", in)
		}
	}
}

func sum(subject, mode string, rps, p50 float64) result.Summary {
	return result.Summary{Subject: subject, Mode: mode, Concurrency: 16, RPS: rps, P50Ms: p50}
}

// TestPairedRatios: the i-th run of one group over the i-th of the other,
// pairs whose divisor is zero left out, none without both groups.
func TestPairedRatios(t *testing.T) {
	x := &group{Runs: []result.Summary{{RPS: 100}, {RPS: 300}, {RPS: 50}, {RPS: 9}}}
	y := &group{Runs: []result.Summary{{RPS: 50}, {RPS: 0}, {RPS: 100}}}
	if got, want := pairedRatios(x, y), []float64{2, 0.5}; !slices.Equal(got, want) {
		t.Errorf("pairedRatios = %v, want %v", got, want)
	}
	if got := pairedRatios(x, nil); got != nil {
		t.Errorf("pairedRatios without a group = %v, want none", got)
	}
}

// TestGroupMedian: a point's figure is its run with the median req/s (the
// lower middle one for an even count), with the range of all its runs.
func TestGroupMedian(t *testing.T) {
	rep := newReport([]result.Summary{
		sum("A", "unique", 300, 1), sum("A", "unique", 100, 3), sum("A", "unique", 200, 2),
		sum("B", "unique", 40, 1), sum("B", "unique", 10, 1), sum("B", "unique", 30, 1), sum("B", "unique", 20, 1),
	}, machine{})
	a := rep.Groups[key("A", "unique", 16)]
	if a.Median.RPS != 200 || a.Median.P50Ms != 2 || a.MinRPS != 100 || a.MaxRPS != 300 {
		t.Errorf("A: median %v (p50 %v), range %v-%v; want the 200 run, 100-300", a.Median.RPS, a.Median.P50Ms, a.MinRPS, a.MaxRPS)
	}
	if b := rep.Groups[key("B", "unique", 16)]; b.Median.RPS != 20 {
		t.Errorf("B: median %v, want 20", b.Median.RPS)
	}
}

// TestReplayRatioPairsRuns: the replay/miss ratio is the median of the
// ratios of runs from the same block, not the ratio of two medians from
// different runs (which here would be 2).
func TestReplayRatioPairsRuns(t *testing.T) {
	rep := newReport([]result.Summary{
		sum("A", "unique", 100, 8), sum("A", "hot", 100, 8), // block 1
		sum("A", "hot", 200, 2), sum("A", "unique", 50, 9), // block 2, the other order
		sum("A", "unique", 100, 8), sum("A", "hot", 400, 1), // block 3
	}, machine{})
	q := find(t, rep, "replay/miss throughput at 16 clients")
	if q.Value != 4 {
		t.Errorf("replay/miss = %v, want 4, the median of the pairs 1, 4, 4", q.Value)
	}
	// Latency: miss p50 / replay p50 of the same pairs: 1, 4.5, 8.
	if !strings.Contains(q.Detail, "pairs 4.50x") || q.Met == nil || !*q.Met {
		t.Errorf("replay/miss detail %q, met %v; want the paired latency 4.50x, met", q.Detail, q.Met)
	}
}

// TestABRatioPairsRuns: so are A/B and A/C.
func TestABRatioPairsRuns(t *testing.T) {
	rep := newReport([]result.Summary{
		sum("A", "unique", 100, 1), sum("B", "unique", 200, 1), sum("C", "unique", 100, 1),
		sum("B", "unique", 100, 1), sum("C", "unique", 50, 1), sum("A", "unique", 90, 1),
		sum("C", "unique", 200, 1), sum("A", "unique", 300, 1), sum("B", "unique", 310, 1),
	}, machine{})
	if q := find(t, rep, "A/B throughput at 16 clients"); q.Value != 0.9 {
		t.Errorf("A/B = %v, want 0.9 (pairs 0.5, 0.9, 0.97)", q.Value)
	}
	if q := find(t, rep, "A/C throughput at 16 clients"); q.Value != 1.5 {
		t.Errorf("A/C = %v, want 1.5 (pairs 1, 1.8, 1.5)", q.Value)
	}
}

// TestNoopRatios: N against pgbench running N's SQL, each target paired by
// block and judged on its own, with N's server CPU per request, in the
// table and the Markdown.
func TestNoopRatios(t *testing.T) {
	n := func(mode string, rps, cpu float64) result.Summary {
		s := sum("N", mode, rps, 1)
		s.CPUServerUs = cpu
		return s
	}
	rep := newReport([]result.Summary{
		n("unique", 600, 300), sum("P", "noop_unique", 1000, 1), n("hot", 900, 200), sum("P", "noop_hot", 3000, 1), // block 1
		sum("P", "noop_hot", 2000, 1), n("hot", 1200, 210), sum("P", "noop_unique", 2000, 1), n("unique", 1000, 320), // block 2
		n("unique", 700, 310), n("hot", 1000, 190), sum("P", "noop_unique", 1000, 1), sum("P", "noop_hot", 1000, 1), // block 3
	}, machine{})
	miss := find(t, rep, "N new keys / pgbench claim+complete at 16 clients")
	// Pairs 0.6, 0.5, 0.7: the median is 0.6, exactly the target.
	if miss.Value != 0.6 || miss.Target != 0.60 || miss.Met == nil || !*miss.Met {
		t.Errorf("miss ratio %v, target %v, met %v; want 0.60 of 0.60, met", miss.Value, miss.Target, miss.Met)
	}
	if !strings.Contains(miss.Detail, "server CPU per request 310 µs (runs: 300, 320, 310)") {
		t.Errorf("miss detail %q lacks the median server CPU of N's runs", miss.Detail)
	}
	replay := find(t, rep, "N replays / pgbench replay at 16 clients")
	// Pairs 0.3, 0.6, 1.0: the median 0.6 would meet 0.50; the ratio of
	// the medians (1000/2000) would not be the figure.
	if replay.Value != 0.6 || replay.Target != 0.50 || replay.Met == nil || !*replay.Met {
		t.Errorf("replay ratio %v, target %v, met %v; want 0.60 of 0.50, met", replay.Value, replay.Target, replay.Met)
	}
	if !strings.Contains(replay.Detail, "server CPU per request 200 µs") {
		t.Errorf("replay detail %q lacks the median server CPU", replay.Detail)
	}

	var rows []string
	for _, rw := range rep.rows() {
		rows = append(rows, rw.s.Subject+" "+rw.s.Mode)
	}
	for _, want := range []string{"N unique", "P noop_unique", "N hot", "P noop_hot"} {
		if !slices.Contains(rows, want) {
			t.Errorf("table rows %v lack %s", rows, want)
		}
	}

	// A missed target reads as missed.
	low := newReport([]result.Summary{n("unique", 100, 300), sum("P", "noop_unique", 1000, 1)}, machine{})
	md := low.markdown(low.text(), "", "make bench/load", "bench/chart.svg")
	if !strings.Contains(md, "| N new keys / pgbench claim+complete at 16 clients | 0.10 | >= 0.60 | **missed** |") {
		t.Errorf("markdown lacks the missed no-op target:\n%s", md)
	}
	if !strings.Contains(md, "| N: no-op ordinary route, middleware on, new key each (miss) | unique | 16 | 100 |") {
		t.Errorf("markdown lacks N's row:\n%s", md)
	}
	if strings.Contains(md, "N replays / pgbench replay") {
		t.Errorf("markdown has a replay ratio without replay runs:\n%s", md)
	}
	if txt := low.text(); !strings.Contains(txt, "target >= 0.60: MISSED") {
		t.Errorf("text lacks the MISSED verdict:\n%s", txt)
	}
}

func find(t *testing.T, rep *report, name string) ratio {
	t.Helper()
	for _, q := range rep.Ratios {
		if q.Name == name {
			return q
		}
	}
	t.Fatalf("no ratio %q in %v", name, rep.Ratios)
	return ratio{}
}

// TestNoopFloorRatios: N0 against pgbench and N against N0, paired by
// block, with no target, both server CPUs in N/N0's detail, N0's rows in
// the table; none without N0's runs.
func TestNoopFloorRatios(t *testing.T) {
	s := func(subject, mode string, rps, cpu float64) result.Summary {
		x := sum(subject, mode, rps, 1)
		x.CPUServerUs = cpu
		return x
	}
	rep := newReport([]result.Summary{
		s("N", "hot", 400, 80), s("N0", "hot", 800, 40), s("P", "noop_hot", 1000, 0), s("N0", "unique", 300, 90), s("P", "noop_unique", 1000, 0), // block 1
		s("N0", "hot", 500, 44), s("P", "noop_hot", 2000, 0), s("N", "hot", 400, 84), s("P", "noop_unique", 500, 0), s("N0", "unique", 400, 95), // block 2
		s("P", "noop_hot", 1000, 0), s("N", "hot", 600, 82), s("N0", "hot", 600, 42), s("N0", "unique", 200, 100), s("P", "noop_unique", 1000, 0), // block 3
	}, machine{})
	// N0/P replays: pairs 0.8, 0.25, 0.6; N/N0 replays: 0.5, 0.8, 1.0.
	floor := find(t, rep, "N0 replays / pgbench replay at 16 clients")
	if floor.Value != 0.6 || floor.Met != nil || floor.Target != 0 {
		t.Errorf("N0/P replays %v (target %v, met %v), want 0.60 with no target", floor.Value, floor.Target, floor.Met)
	}
	if !strings.Contains(floor.Detail, "N0 server CPU per request 42 µs") || !strings.Contains(floor.Detail, "net/http + pgx") {
		t.Errorf("N0/P detail %q lacks N0's CPU or what the floor is", floor.Detail)
	}
	over := find(t, rep, "N replays / N0 replays at 16 clients")
	if over.Value != 0.8 || over.Met != nil {
		t.Errorf("N/N0 replays %v (met %v), want 0.80 with no target", over.Value, over.Met)
	}
	if !strings.Contains(over.Detail, "server CPU per request 82 µs (runs: 80, 84, 82) vs 42 µs (runs: 40, 44, 42)") {
		t.Errorf("N/N0 detail %q lacks both servers' CPU", over.Detail)
	}
	// New keys: pairs 0.3, 0.8, 0.2; no N unique runs, so no N/N0.
	if q := find(t, rep, "N0 new keys / pgbench claim+complete at 16 clients"); q.Value != 0.3 {
		t.Errorf("N0/P new keys %v, want 0.30", q.Value)
	}
	for _, q := range rep.Ratios {
		if q.Name == "N new keys / N0 new keys at 16 clients" {
			t.Errorf("a ratio N/N0 for new keys without N's runs: %+v", q)
		}
	}
	var rows []string
	for _, rw := range rep.rows() {
		rows = append(rows, rw.s.Subject+" "+rw.s.Mode)
	}
	if want := []string{"N0 unique", "P noop_unique", "N hot", "N0 hot", "P noop_hot"}; !slices.Equal(rows, want) {
		t.Errorf("table rows %v, want %v", rows, want)
	}
	md := rep.markdown(rep.text(), "", "make bench/load", "bench/chart.svg")
	if !strings.Contains(md, "| N replays / N0 replays at 16 clients | 0.80 | - | - |") {
		t.Errorf("markdown lacks N/N0 without a target:\n%s", md)
	}
}
