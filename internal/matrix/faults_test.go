//go:build matrix

package matrix

import (
	"sync"
	"testing"
)

// fault is one row of the matrix: what it does to a cell and what the
// contract says the cell answers. run builds the cell's env (newEnv, with
// the fault's options) and checks it; env.failf notes what it saw.
type fault struct {
	name string
	na   func(c column) string // "" when the fault applies to c
	run  func(t *testing.T, c cell)
	// global: the fault takes a lock of the whole MariaDB server (FLUSH
	// TABLES WITH READ LOCK), so no other MariaDB cell runs meanwhile.
	global bool
}

// faults lists every fault the DESIGN names, in the report's order.
var faults = sync.OnceValue(func() []*fault {
	var all []*fault
	for _, group := range [][]*fault{
		baselineFaults(),
		{deadlockFault()},
		batchFaults(),
		txFaults(),
		lockFaults(),
		poolFaults(),
		linkFaults(),
		bodyFaults(),
		keyFaults(),
		waitFaults(),
		expiredFaults(),
		reconcileFaults(),
		{crashFault()},
		{deriveCrashFault()},
		venueFaults(),
		heartbeatFaults(),
	} {
		all = append(all, group...)
	}
	return all
})

// simple makes a fault whose cell is built with o and checked by check.
func simple(name string, na func(column) string, o envOpts, check func(e *env)) *fault {
	return &fault{name: name, na: na, run: func(t *testing.T, c cell) {
		check(newEnv(t, c, o))
	}}
}

// needsDB: the fault needs a database (a session, a table, a link).
func needsDB(why string) func(column) string {
	return func(c column) string {
		if !c.store.sqlDB() {
			return why
		}
		return ""
	}
}

// needsTx: the fault needs the lent transaction.
func needsTx(c column) string {
	if !c.v.tx {
		return naOrdTx
	}
	return ""
}

// both joins N/A rules: the first reason found wins.
func both(rules ...func(column) string) func(column) string {
	return func(c column) string {
		for _, r := range rules {
			if why := r(c); why != "" {
				return why
			}
		}
		return ""
	}
}
