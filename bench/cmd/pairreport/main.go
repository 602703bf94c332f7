// Command pairreport turns the loadgen runs of an interleaved comparison
// into a Markdown table: bench/beforeafter.sh (two git refs) and
// bench/load.sh -seal (sealing off and on) use it.
//
// Each run's subject is NAME/VARIANT (A/before, N/on ...). Runs of one NAME
// and mode are grouped; the i-th run of -base and the i-th run of -other
// come from the same block (the scripts run them next to each other), and
// the ratio of a group is the median of those pairs' ratios. req/s and CPU
// per request are medians over the runs of each variant.
//
//	pairreport -base before -other after bench/results/beforeafter.log
//
// Exit status 1 when a group lacks runs of either variant or their counts
// differ (a run failed: the pairs would not match), 2 for a usage error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/idemkit/idempotency/bench/internal/result"
)

func main() {
	base := flag.String("base", "before", "the variant the ratio divides by")
	other := flag.String("other", "after", "the variant compared with -base")
	dbLabel := flag.String("db-label", "PostgreSQL", "what the database CPU column measured (loadgen -db-pids-cmd)")
	flag.Parse()
	if flag.NArg() != 1 || *base == "" || *other == "" || *base == *other {
		fmt.Fprintln(os.Stderr, "usage: pairreport -base V1 -other V2 LOG")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pairreport:", err)
		os.Exit(1)
	}
	defer f.Close()
	runs, err := result.ReadSummaries(f)
	if err == nil {
		err = write(os.Stdout, runs, *base, *other, *dbLabel)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pairreport:", err)
		os.Exit(1)
	}
}

// group is one subject and mode: its runs of each variant, in order.
type group struct {
	name, mode  string
	base, other []result.Summary
}

// subjects and modes, as the table names them.
var (
	subjectNames = map[string]string{
		"A": "A: order route (example server, middleware on)",
		"B": "B: order route, middleware off",
		"N": "N: no-op route (noopserver)",
	}
	modeNames = map[string]string{"unique": "new keys", "hot": "one hot key replayed", "nokey": "no key"}
)

func write(w io.Writer, runs []result.Summary, base, other, dbLabel string) error {
	var groups []*group
	find := func(name, mode string) *group {
		for _, g := range groups {
			if g.name == name && g.mode == mode {
				return g
			}
		}
		g := &group{name: name, mode: mode}
		groups = append(groups, g)
		return g
	}
	for _, s := range runs {
		name, variant, ok := strings.Cut(s.Subject, "/")
		if !ok || (variant != base && variant != other) {
			continue
		}
		g := find(name, s.Mode)
		if variant == base {
			g.base = append(g.base, s)
		} else {
			g.other = append(g.other, s)
		}
	}
	if len(groups) == 0 {
		return fmt.Errorf("no runs of subjects NAME/%s or NAME/%s", base, other)
	}
	var errs []error
	fmt.Fprintf(w, "| subject | requests | %s req/s | %s req/s | %s/%s (pairs) | server CPU µs/req, %s → %s | %s CPU µs/req, %s → %s |\n",
		base, other, other, base, base, other, dbLabel, base, other)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, g := range groups {
		if len(g.base) == 0 || len(g.base) != len(g.other) {
			errs = append(errs, fmt.Errorf("%s %s: %d runs of %s, %d of %s: want as many of each, at least one",
				g.name, g.mode, len(g.base), base, len(g.other), other))
			continue
		}
		var ratios []float64
		for i := range g.base {
			ratios = append(ratios, g.other[i].RPS/g.base[i].RPS)
		}
		subject := g.name
		if n, ok := subjectNames[g.name]; ok {
			subject = n
		}
		mode := g.mode
		if n, ok := modeNames[g.mode]; ok {
			mode = n
		}
		pairs := make([]string, len(ratios))
		for i, r := range ratios {
			pairs[i] = fmt.Sprintf("%.2f", r)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | **%.2f** (%s) | %s | %s |\n", subject, mode,
			rpsCell(g.base), rpsCell(g.other), median(ratios), strings.Join(pairs, ", "),
			cpuCell(g.base, g.other, func(s result.Summary) float64 { return s.CPUServerUs }),
			cpuCell(g.base, g.other, func(s result.Summary) float64 { return s.CPUDBUs }))
	}
	return errors.Join(errs...)
}

// rpsCell is the median req/s and the range of a variant's runs.
func rpsCell(runs []result.Summary) string {
	v := values(runs, func(s result.Summary) float64 { return s.RPS })
	return fmt.Sprintf("%.0f (%.0f-%.0f)", median(v), slices.Min(v), slices.Max(v))
}

// cpuCell is the medians of a CPU figure for both variants, and the
// median and range of the pairs' ratios (other/base, runs of one block);
// "-" when it was not measured.
func cpuCell(base, other []result.Summary, f func(result.Summary) float64) string {
	b, o := median(values(base, f)), median(values(other, f))
	if b <= 0 || o <= 0 {
		return "-"
	}
	var ratios []float64
	for i := range base {
		if x, y := f(base[i]), f(other[i]); x > 0 && y > 0 {
			ratios = append(ratios, y/x)
		}
	}
	return fmt.Sprintf("%.0f → %.0f (pairs ×%.2f, %.2f-%.2f)", b, o, median(ratios), slices.Min(ratios), slices.Max(ratios))
}

func values(runs []result.Summary, f func(result.Summary) float64) []float64 {
	v := make([]float64, len(runs))
	for i, s := range runs {
		v[i] = f(s)
	}
	return v
}

// median of v; the mean of the middle two for an even count; 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
