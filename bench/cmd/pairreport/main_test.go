package main

import (
	"strings"
	"testing"

	"github.com/idemkit/idempotency/bench/internal/result"
)

// TestWritePairsRunsOfABlock: the ratio is the median of the i-th runs'
// ratios (not the ratio of the medians), the CPU cells are the variants'
// medians with the pairs' ratios, and runs of other labels are left out.
func TestWritePairsRunsOfABlock(t *testing.T) {
	run := func(subject, mode string, rps, cpu, db float64) result.Summary {
		return result.Summary{Subject: subject, Mode: mode, RPS: rps, CPUServerUs: cpu, CPUDBUs: db}
	}
	runs := []result.Summary{
		run("A/before", "unique", 100, 300, 200), run("A/after", "unique", 90, 330, 210),
		run("A/after", "unique", 200, 310, 220), run("A/before", "unique", 100, 290, 200),
		run("A/before", "unique", 100, 310, 190), run("A/after", "unique", 110, 320, 200),
		run("A", "unique", 1, 1, 1), run("A/rtt", "unique", 1, 1, 1),
	}
	var b strings.Builder
	if err := write(&b, runs, "before", "after", "PostgreSQL"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| A: order route (example server, middleware on) | new keys | 100 (100-100) | 110 (90-200) | **1.10** (0.90, 2.00, 1.10) | 300 → 320 (pairs ×1.07, 1.03-1.10) | 200 → 210 (pairs ×1.05, 1.05-1.10) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks\n%s\ngot\n%s", want, out)
		}
	}
	if strings.Count(out, "\n") != 3 {
		t.Errorf("want a header, a rule and one row, got\n%s", out)
	}
}

// TestWriteUnmatchedRuns: a group whose variants ran a different number
// of times (a failed run) is an error, not a ratio of unmatched runs.
func TestWriteUnmatchedRuns(t *testing.T) {
	runs := []result.Summary{
		{Subject: "N/off", Mode: "hot", RPS: 1}, {Subject: "N/on", Mode: "hot", RPS: 1}, {Subject: "N/off", Mode: "hot", RPS: 1},
	}
	var b strings.Builder
	if err := write(&b, runs, "off", "on", "PostgreSQL"); err == nil || !strings.Contains(err.Error(), "N hot: 2 runs of off, 1 of on") {
		t.Errorf("err %v, want the unmatched counts named", err)
	}
}
