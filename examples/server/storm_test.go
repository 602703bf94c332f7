package main

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/internal/testdb"
)

// Settings of the storm test: two servers with small pools, many more
// clients than connections.
const (
	stormPoolConns = 6
	stormKeys      = 20
	stormCopies    = 8 // concurrent requests per key, spread over both servers
)

// TestTxStormTwoServers: a storm of duplicates on the transactional order
// route, sent to two server processes sharing one database, each with a
// pool far smaller than the number of concurrent requests. Every key
// executes exactly once (one order, one order_placed row); every other
// answer is 409 in flight or the replay, never a 503: a duplicate holds a
// connection only for its bounded lock wait, so the pools are never
// exhausted past the store timeout. Each server's connections, sampled in
// pg_stat_activity throughout, never exceed its pool.
func TestTxStormTwoServers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	t.Parallel()
	dsn := testdb.NewDSN(t)
	db := crashDB(t, dsn)
	bin := crashBuildServer(t)
	common := []string{"-addr", "127.0.0.1:0", "-lease", crashLease.String(), "-store-timeout", crashStoreTimeout.String(),
		"-order-latency", "20ms"}
	var procs []*crashProc
	var apps []string
	for range 2 {
		app := "idem_storm_" + crashRandHex(6)
		d, err := crashWithParam(dsn, "application_name", app)
		if err == nil {
			d, err = crashWithParam(d, "pool_max_conns", strconv.Itoa(stormPoolConns))
		}
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, crashStart(t, bin, nil, append([]string{"-database-url", d}, common...)...))
		apps = append(apps, app)
	}
	uid, tok := procs[0].c.newUser(t)

	// Sample each server's connections while the storm runs.
	stop := make(chan struct{})
	var maxHeld [2]atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			for i, app := range apps {
				var n int64
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
				cancel()
				if err != nil {
					t.Errorf("sampling connections: %v", err)
					return
				}
				for cur := maxHeld[i].Load(); n > cur && !maxHeld[i].CompareAndSwap(cur, n); cur = maxHeld[i].Load() {
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()

	keys := make([]string, stormKeys)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	type answer struct {
		key string
		r   response
		err error
	}
	answers := make(chan answer, stormKeys*stormCopies)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, key := range keys {
		for c := range stormCopies {
			p := procs[(i+c)%2]
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
	close(stop)
	<-sampled
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
		case a.r.Status == http.StatusServiceUnavailable && a.r.Body["error"] == "idempotency_store_unavailable" &&
			a.r.Header.Get("Retry-After") != "":
			// The contract's answer to a claim past the store timeout (500 ms
			// here; CI's parallel packages load the machine): the handler did
			// not run, and the retries below must still execute each key once.
			unavailable++
		default:
			t.Fatalf("key %s: unexpected answer %s", a.key, a.r)
		}
	}
	for _, key := range keys {
		if executed[key] > 1 {
			t.Fatalf("key %s executed %d times", key, executed[key])
		}
		if n := crashCount(t, db, `SELECT count(*) FROM paper_orders WHERE client_order_id = $1`, key); n != executed[key] {
			t.Fatalf("key %s: %d orders committed, %d executions answered", key, n, executed[key])
		}
		// A key whose every copy met another in flight has no execution
		// yet: its retry executes or replays, never a second order.
		var r response
		for range 5 { // a 503 (store timeout under load) is retried, as a client would
			r, _ = procs[0].send(t, req{method: "POST", path: "/api/trading/orders", token: tok, key: key,
				body: map[string]any{"symbol": "AAPL", "side": "buy", "qty": 1}})
			if r.Status != http.StatusServiceUnavailable {
				break
			}
		}
		if r.Status != http.StatusCreated {
			t.Fatalf("key %s after the storm: %s", key, r)
		}
	}
	if n := crashCount(t, db, `SELECT count(*) FROM paper_orders WHERE user_id = $1`, uid); n != stormKeys {
		t.Fatalf("%d orders for %d keys, want one each", n, stormKeys)
	}
	if n := crashCount(t, db, `SELECT count(*) FROM audit_log WHERE user_id = $1 AND action = 'order_placed'`, uid); n != stormKeys {
		t.Fatalf("%d order_placed rows for %d keys, want one each", n, stormKeys)
	}
	// A statement its deadline interrupted (a 503) closes its connection
	// from our side; its backend can outlive it for a moment while the pool
	// opens the replacement (seen on a machine whose backends take 20 ms to
	// start), so each 503 may add one backend to the count.
	for i := range apps {
		if held := maxHeld[i].Load(); held > int64(stormPoolConns+unavailable) {
			t.Errorf("server %d held %d connections, over its pool of %d and the %d interrupted by a deadline", i+1, held, stormPoolConns, unavailable)
		}
	}
	t.Logf("%d requests (%d keys x %d) over 2 servers with %d connections each in %v: %d executions during the storm, %d replays, %d in flight, %d store unavailable; connections held at most %d and %d",
		stormKeys*stormCopies, stormKeys, stormCopies, stormPoolConns, took.Round(time.Millisecond),
		len(executed), replays, inFlight, unavailable, maxHeld[0].Load(), maxHeld[1].Load())
}
