//go:build matrix

package matrix

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// state is how a cell ended.
type state int

const (
	stateNA state = iota + 1
	statePassed
	stateFailed
)

// result is one cell's end.
type result struct {
	state state
	notes []string // the N/A reason, or what a failed cell saw
}

// results collects the cells' ends; safe for concurrent use.
type results struct {
	mu    sync.Mutex
	cells map[string]result // by cell name
	order []cell
}

func newResults() *results { return &results{cells: map[string]result{}} }

// add records c's end.
func (r *results) add(c cell, s state, notes ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.cells[c.String()]; !ok {
		r.order = append(r.order, c)
	}
	r.cells[c.String()] = result{s, notes}
}

// shownVariants are the report's variant columns: a transactional route is
// always fail-closed, so its fail-open variants (N/A, counted in the
// totals) are not printed.
var shownVariants = variants[:6]

// print writes the matrix: one row per fault and entry point, one column
// per store, one character per variant; then the totals, each N/A reason
// once with the cells it covers, each failed cell with what it saw, and
// the wall time.
func (r *results) print(w io.Writer, wall time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(w, "\nFAULT MATRIX  lease %v, store timeout %v\n", lease, storeTimeout)
	fmt.Fprintf(w, "each store column: %s\n", variantLegend())
	fmt.Fprintf(w, "  . passed   F failed   - N/A (reasons below)   (blank: not selected)\n\n")
	fmt.Fprintf(w, "%-28s %-8s", "fault", "entry")
	for _, s := range stores {
		fmt.Fprintf(w, " %-9s", s)
	}
	fmt.Fprintln(w)
	for _, f := range faults() {
		for _, e := range entries {
			row := fmt.Sprintf("%-28s %-8s", f.name, e)
			any := false
			for _, s := range stores {
				var b strings.Builder
				for _, v := range shownVariants {
					res, ok := r.cells[cell{column{e, s, v}, f}.String()]
					b.WriteByte(mark(res, ok))
					any = any || ok
				}
				row += fmt.Sprintf(" %-9s", b.String())
			}
			if any {
				fmt.Fprintln(w, row)
			}
		}
	}
	r.printTotals(w, wall)
}

func variantLegend() string {
	names := make([]string, len(shownVariants))
	for i, v := range shownVariants {
		names[i] = v.String()
	}
	return strings.Join(names, " ")
}

func mark(res result, ok bool) byte {
	switch {
	case !ok:
		return ' '
	case res.state == statePassed:
		return '.'
	case res.state == stateFailed:
		return 'F'
	}
	return '-'
}

// printTotals writes the counts, the N/A reasons and the failures.
func (r *results) printTotals(w io.Writer, wall time.Duration) {
	var run, passed, failed, na int
	byReason := map[string][]cell{}
	var failures []cell
	for _, c := range r.order {
		res := r.cells[c.String()]
		switch res.state {
		case statePassed:
			run++
			passed++
		case stateFailed:
			run++
			failed++
			failures = append(failures, c)
		case stateNA:
			na++
			byReason[res.notes[0]] = append(byReason[res.notes[0]], c)
		}
	}
	fmt.Fprintf(w, "\ncells: %d run, %d passed, %d failed, %d N/A\n", run, passed, failed, na)
	reasons := make([]string, 0, len(byReason))
	for k := range byReason {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for _, k := range reasons {
		fmt.Fprintf(w, "N/A %4d cells: %s\n          %s\n", len(byReason[k]), k, cover(byReason[k]))
	}
	for _, c := range failures {
		notes := r.cells[c.String()].notes
		fmt.Fprintf(w, "FAILED %s\n", c)
		for i, n := range notes {
			if i == 5 {
				fmt.Fprintf(w, "    ... %d more\n", len(notes)-i)
				break
			}
			fmt.Fprintf(w, "    %s\n", n)
		}
	}
	fmt.Fprintf(w, "wall time: %v\n", wall.Round(time.Second))
}

// cover summarises the cells a reason covers: the faults, entry points,
// stores and variants among them.
func cover(cs []cell) string {
	var fs, es, ss, vs []string
	for _, c := range cs {
		fs = addOnce(fs, c.fault.name)
		es = addOnce(es, string(c.entry))
		ss = addOnce(ss, string(c.store))
		vs = addOnce(vs, c.v.String())
	}
	all := func(got []string, n int) string {
		if len(got) == n {
			return "all"
		}
		return strings.Join(got, ",")
	}
	return fmt.Sprintf("faults: %s; entries: %s; stores: %s; variants: %s",
		all(fs, len(faults())), all(es, len(entries)), all(ss, len(stores)), all(vs, len(variants)))
}

func addOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
