//go:build matrix

package matrix

import (
	"fmt"
	"time"
)

// The matrix's dimensions (DESIGN-settled-r4 item 11): a column is one
// entry point x store x variant, a row one fault; a cell is one column run
// against one fault.

// Settings every cell runs with.
const (
	lease = 2 * time.Second
	// storeTimeout leaves the outage probe's new connection time to open:
	// on a CI machine where a PostgreSQL backend took 20 ms to start
	// (pgbench -C), several cells dialling at once, 200 ms made healthy
	// probes fail and fail-open cells bypass.
	storeTimeout = 400 * time.Millisecond
	// margin is added to every "never hangs" bound: generous, never a
	// speed assertion.
	margin = 3 * time.Second
)

type entryKind string

const (
	entryHTTP    entryKind = "http"
	entryDo      entryKind = "do"
	entryGRPC    entryKind = "grpc"
	entryConnect entryKind = "connect"
)

var entries = []entryKind{entryHTTP, entryDo, entryGRPC, entryConnect}

type storeKind string

const (
	storeMemory storeKind = "memory"
	storePgx    storeKind = "pgx"
	storeSQLPgx storeKind = "sql-pgx" // sqlstore on pgx's stdlib
	storeSQLPq  storeKind = "sql-pq"  // sqlstore on lib/pq
	storeMySQL  storeKind = "sql-mysql"
)

var stores = []storeKind{storeMemory, storePgx, storeSQLPgx, storeSQLPq, storeMySQL}

// sqlDB reports whether the store runs on a database (not memory).
func (s storeKind) sqlDB() bool { return s != storeMemory }

// mysql reports whether the store is on MariaDB.
func (s storeKind) mysql() bool { return s == storeMySQL }

// variant is the route's policy: ordinary or transactional, fail-closed or
// fail-open, plain or sealed (NewSealingStore around the store).
type variant struct {
	tx, open, sealed bool
}

// variants in the order the report prints them.
var variants = []variant{
	{false, false, false}, {false, false, true},
	{false, true, false}, {false, true, true},
	{true, false, false}, {true, false, true},
	{true, true, false}, {true, true, true},
}

func (v variant) String() string {
	mode, policy, seal := "ord", "closed", "plain"
	if v.tx {
		mode = "tx"
	}
	if v.open {
		policy = "open"
	}
	if v.sealed {
		seal = "sealed"
	}
	return mode + "/" + policy + "/" + seal
}

// column is one entry point x store x variant.
type column struct {
	entry entryKind
	store storeKind
	v     variant
}

func (c column) String() string { return fmt.Sprintf("%s/%s/%s", c.entry, c.store, c.v) }

// cell is one column against one fault.
type cell struct {
	column
	fault *fault
}

func (c cell) String() string { return c.column.String() + "/" + c.fault.name }

// Reasons a cell does not apply, each listed once in the report.
const (
	naTxOpen    = "a transactional route is fail-closed only: construction refuses FailOpen"
	naMemoryTx  = "the memory store has no transactions"
	naMemoryNet = "the memory store has no link to cut and no pool"
	naMemoryDB  = "the memory store has no database session or table to lock"
	naMemoryCr  = "the memory store does not survive a crash"
	naOrdTx     = "an ordinary route lends no transaction: the handler's session is not the store's"
	naNotMySQL  = "MySQL-only statement"
	naNotPG     = "PostgreSQL-only statement"
)

// baseNA is the reason a column does not apply to any fault, or "".
func baseNA(c column) string {
	if c.v.tx && c.v.open {
		return naTxOpen
	}
	if c.v.tx && c.store == storeMemory {
		return naMemoryTx
	}
	return ""
}

// cells lists every cell of the matrix, each with its N/A reason ("" runs).
func allCells() []cell {
	var out []cell
	for _, f := range faults() {
		for _, e := range entries {
			for _, s := range stores {
				for _, v := range variants {
					out = append(out, cell{column{e, s, v}, f})
				}
			}
		}
	}
	return out
}
