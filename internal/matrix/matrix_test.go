//go:build matrix

package matrix

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestMatrix runs every cell that applies, at most MATRIX_PARALLEL at
// once, and prints the matrix. It fails only for a failed cell, never for
// its time.
func TestMatrix(t *testing.T) {
	start := time.Now()
	par, _ := strconv.Atoi(os.Getenv("MATRIX_PARALLEL"))
	if par <= 0 {
		par = 4
	}
	var sel *regexp.Regexp
	if s := os.Getenv("MATRIX_RUN"); s != "" {
		sel = regexp.MustCompile(s)
	}
	res := newResults()
	sem := make(chan struct{}, par)
	t.Run("cells", func(t *testing.T) {
		for _, c := range allCells() {
			if sel != nil && !sel.MatchString(c.String()) {
				continue
			}
			if why := c.na(); why != "" {
				res.add(c, stateNA, why)
				continue
			}
			t.Run(c.String(), func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				runCell(t, c, res)
			})
		}
	})
	res.print(os.Stdout, time.Since(start))
}

// na is the reason c does not apply, or "".
func (c cell) na() string {
	if why := baseNA(c.column); why != "" {
		return why
	}
	if c.fault.na != nil {
		return c.fault.na(c.column)
	}
	return ""
}

// runCell runs c's fault and records whether it passed; a cell that
// panics or calls FailNow is recorded as failed too.
func runCell(t *testing.T, c cell, res *results) {
	defer func() {
		notes := takeNotes(t)
		if p := recover(); p != nil {
			notes = append(notes, fmt.Sprintf("panic: %v", p))
			t.Errorf("panic: %v", p)
		}
		if t.Failed() || len(notes) > 0 {
			if len(notes) == 0 {
				notes = []string{"failed (see the test log)"}
			}
			res.add(c, stateFailed, notes...)
			return
		}
		res.add(c, statePassed)
	}()
	if c.store.mysql() {
		if c.fault.global {
			mysqlServer.Lock()
			defer mysqlServer.Unlock()
		} else {
			mysqlServer.RLock()
			defer mysqlServer.RUnlock()
		}
	}
	c.fault.run(t, c)
}

// mysqlServer is held shared by every MariaDB cell and exclusively by a
// cell whose fault locks the whole server.
var mysqlServer sync.RWMutex

// notes holds what each running cell saw that the contract forbids, by its
// *testing.T.
var notes sync.Map

// note records msg for t's cell.
func note(t *testing.T, msg string) {
	v, _ := notes.LoadOrStore(t, &noteList{})
	l := v.(*noteList)
	l.mu.Lock()
	l.msgs = append(l.msgs, msg)
	l.mu.Unlock()
}

// takeNotes returns and forgets t's notes.
func takeNotes(t *testing.T) []string {
	v, ok := notes.LoadAndDelete(t)
	if !ok {
		return nil
	}
	l := v.(*noteList)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs
}

type noteList struct {
	mu   sync.Mutex
	msgs []string
}
