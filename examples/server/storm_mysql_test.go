package main

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/internal/testdb/mysqldb"
)

// Settings of the MariaDB storm: 32 concurrent duplicates of each key.
const (
	mysqlStormKeys   = 8
	mysqlStormCopies = 32
)

// TestTxStormMySQL: a storm of mysqlStormCopies concurrent duplicates for
// each of mysqlStormKeys keys on the transactional order route on MariaDB,
// sent to one server process, and spread over two sharing one database.
// InnoDB takes next-key locks on duplicate inserts, and an owner that rolls
// back can make two waiting duplicates deadlock (1213): the store restarts
// such a claim, so every answer is the contract's: 201 (the one execution
// or its replay), 409 in flight, or 503 should the pool saturate (each
// execution closes its connection, so a storm opens one per execution;
// counted, and none was seen here); never a deadlock error.
// Every key executes exactly once: one order, one order_placed row.
func TestTxStormMySQL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	// Not parallel: it runs before the package's parallel tests, so its
	// 256 requests do not starve the PostgreSQL storm's pools, nor they it.
	for _, servers := range []int{1, 2} {
		t.Run(map[int]string{1: "OneServer", 2: "TwoServers"}[servers], func(t *testing.T) {
			mysqlStorm(t, servers)
		})
	}
}

func mysqlStorm(t *testing.T, servers int) {
	d := mysqldb.NewEmpty(t)
	db := d.Open(t, 2)
	bin := crashBuildServer(t)
	// Every execution closes its connection (a MySQL session cannot be
	// reset): the store timeout leaves room for reopening them on a loaded
	// machine.
	common := []string{"-addr", "127.0.0.1:0", "-lease", "8s", "-store-timeout", "2s",
		"-order-latency", "20ms", "-database-url", d.DSN}
	var procs []*crashProc
	for range servers {
		procs = append(procs, crashStart(t, bin, nil, common...))
	}
	uid, tok := procs[0].c.newUser(t)
	keys := make([]string, mysqlStormKeys)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	type answer struct {
		key string
		r   response
		err error
	}
	answers := make(chan answer, mysqlStormKeys*mysqlStormCopies)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, key := range keys {
		for c := range mysqlStormCopies {
			p := procs[(i+c)%servers]
			wg.Go(func() {
				<-start
				r, err := p.c.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key,
					body: map[string]any{"symbol": "AAPL", "side": "buy", "qty": 1}})
				answers <- answer{key, r, err}
			})
		}
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	close(answers)
	executed := map[string]int{}
	inFlight, replays, unavailable := 0, 0, 0
	for a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("key %s: %v", a.key, a.err)
		case a.r.Status == http.StatusCreated && a.r.Header.Get("Idempotent-Replayed") == "":
			executed[a.key]++
		case a.r.Status == http.StatusCreated:
			replays++
		case a.r.Status == http.StatusConflict && a.r.Body["error"] == "idempotency_in_flight":
			inFlight++
		case crashUnavailable(a.r):
			unavailable++ // a saturated pool (every request opens a connection): the contract's 503, retried below
		default:
			t.Fatalf("key %s: an answer outside the contract's (201, 409 in flight, 503): %s\n%s", a.key, a.r, procs[0].notable())
		}
	}
	for _, key := range keys {
		if executed[key] > 1 {
			t.Fatalf("key %s executed %d times", key, executed[key])
		}
		if n := mysqlCount(t, db, `SELECT COUNT(*) FROM paper_orders WHERE client_order_id = ?`, key); n != executed[key] {
			t.Fatalf("key %s: %d orders committed, %d executions answered", key, n, executed[key])
		}
		r, _ := procs[0].send(t, req{method: "POST", path: "/api/trading/orders", token: tok, key: key,
			body: map[string]any{"symbol": "AAPL", "side": "buy", "qty": 1}})
		if r.Status != http.StatusCreated {
			t.Fatalf("key %s after the storm: %s", key, r)
		}
	}
	for i, p := range procs {
		if logs := p.logs.String(); strings.Contains(logs, `"reason":"conflict"`) || strings.Contains(logs, "Deadlock") {
			t.Fatalf("server %d surfaced a deadlock:\n%s", i+1, p.notable())
		}
	}
	if n := mysqlCount(t, db, `SELECT COUNT(*) FROM paper_orders WHERE user_id = ?`, uid); n != mysqlStormKeys {
		t.Fatalf("%d orders for %d keys, want one each", n, mysqlStormKeys)
	}
	if n := mysqlCount(t, db, `SELECT COUNT(*) FROM audit_log WHERE user_id = ? AND action = 'order_placed'`, uid); n != mysqlStormKeys {
		t.Fatalf("%d order_placed rows for %d keys, want one each", n, mysqlStormKeys)
	}
	t.Logf("%d requests (%d keys x %d) over %d server(s) in %v: %d executions during the storm, %d replays, %d in flight, %d 503 (pool saturated)",
		mysqlStormKeys*mysqlStormCopies, mysqlStormKeys, mysqlStormCopies, servers, took.Round(time.Millisecond),
		len(executed), replays, inFlight, unavailable)
}
