package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/internal/testdb"
)

// venueFault is one fault of the venue, as the cells set it.
type venueFault struct {
	name    string
	setting faultSetting
}

var venueFaults = []venueFault{
	{"accept-then-drop", faultSetting{Fault: faultDrop, Count: 1}},
	{"late-answer", faultSetting{Fault: faultDelay, Count: 1, Delay: "6s"}}, // past the handler's 2.5 s
	{"5xx-before-accepting", faultSetting{Fault: fault5xx, Count: 1}},
	{"crash-before-booking", faultSetting{Fault: faultCrashBefore, Count: 1}},
	{"crash-after-booking", faultSetting{Fault: faultCrashAfter, Count: 1}},
}

// killPoints: when the order server gets kill -9, relative to its venue
// call. "after" is once its answer to the first attempt is out.
var killPoints = []string{"none", "before", "during", "after"}

// liveRoute is an order route under test: the example server in live mode
// (transactional on PostgreSQL), or the ordinary-route server.
type liveRoute struct {
	name string
	// start starts a server of the route on the cell's database and venue,
	// waiting latency before each venue call.
	start func(t *testing.T, c *cell, latency time.Duration) *proc
	// auth returns the header that makes the cell's client a user.
	auth func(t *testing.T, c *cell, p *proc) [2]string
	// claimed reports that the order with key holds its claim.
	claimed func(t *testing.T, c *cell, key string) bool
}

// cell is what one (route, fault) test owns: a schema, a venue, the
// binaries.
type cell struct {
	dsn, appName string
	db           *pgx.Conn
	venue        *venueProc
	serverBin    string
}

func newCell(t *testing.T, venueBin, serverBin string) *cell {
	t.Helper()
	c := &cell{dsn: testdb.NewDSN(t), appName: "venue_" + strings.ReplaceAll(uuid.NewString()[:8], "-", ""), serverBin: serverBin}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	db, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	c.db = db
	c.venue = startVenue(t, venueBin)
	return c
}

func (c *cell) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var n int
	if err := c.db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

var exampleRoute = liveRoute{
	name: "transactional",
	start: func(t *testing.T, c *cell, latency time.Duration) *proc {
		u, _ := url.Parse(c.dsn)
		q := u.Query()
		q.Set("application_name", c.appName)
		u.RawQuery = q.Encode()
		cmd := exec.Command(c.serverBin, "-addr", "127.0.0.1:0", "-database-url", u.String(), "-venue-url", c.venue.url(),
			"-lease", testLease.String(), "-store-timeout", testStoreTimeout.String(), "-order-latency", latency.String())
		cmd.Env = append(os.Environ(), "SESSION_SECRET="+testSessionSecret, "IDEMPOTENCY_DERIVE_KEYS="+testDeriveKeys)
		return startProc(t, "example server", cmd)
	},
	auth: func(t *testing.T, c *cell, p *proc) [2]string {
		resp, err := http.Post("http://"+p.addr+"/api/demo/users", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var u struct{ Token string }
		if err := jsonDecode(resp, &u); err != nil || u.Token == "" {
			t.Fatalf("new user: %v", err)
		}
		return [2]string{"Authorization", "Bearer " + u.Token}
	},
	// The claim lives in the handler's transaction: the server's session
	// sits idle in it while the handler waits.
	claimed: func(t *testing.T, c *cell, _ string) bool {
		return c.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'`, c.appName) > 0
	},
}

var ordinaryRoute = liveRoute{
	name: "ordinary",
	start: func(t *testing.T, c *cell, latency time.Duration) *proc {
		return startOrdinary(t, c.dsn, c.venue.url(), latency)
	},
	auth: func(*testing.T, *cell, *proc) [2]string { return [2]string{"X-User-ID", "7"} },
	claimed: func(t *testing.T, c *cell, key string) bool {
		return c.count(t, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1`, key) > 0
	},
}

// cellRow is one line of the table the test prints.
type cellRow struct {
	route, fault, kill string
	orders             int // the venue's orders for the key
	final              string
	requests           int
	note               string
}

// TestVenueLive: each venue fault x kill -9 of the order server before,
// during and after its venue call (and no kill), on the transactional route
// (the example server in live mode) and the ordinary route. After the
// client's retries settle, per key the venue holds at most one order,
// exactly one when the final answer is a success, none when it is an
// error, and the answer is never idempotency_outcome_unknown: the venue
// answers lookups throughout. The table of venue orders and final answers
// is printed at the end (go test -v -run TestVenueLive).
func TestVenueLive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the venue and the example server")
	}
	t.Parallel()
	venueBin, serverBin := buildBinaries(t)
	var mu sync.Mutex
	var rows []cellRow
	t.Run("cells", func(t *testing.T) {
		for _, rt := range []liveRoute{exampleRoute, ordinaryRoute} {
			for _, f := range venueFaults {
				t.Run(rt.name+"/"+f.name, func(t *testing.T) {
					t.Parallel()
					c := newCell(t, venueBin, serverBin)
					for i, kill := range killPoints {
						row := cellRow{route: rt.name, fault: f.name, kill: kill}
						if !t.Run(kill, func(t *testing.T) { row = runCell(t, c, rt, f, kill, i+1, row) }) {
							row.note = "FAILED"
						}
						mu.Lock()
						rows = append(rows, row)
						mu.Unlock()
					}
				})
			}
		}
	})
	printTable(t, rows)
}

// runCell runs one order through one fault and one kill point, with qty
// as the key's mark at the venue, and checks the outcome.
func runCell(t *testing.T, c *cell, rt liveRoute, f venueFault, kill string, qty int, row cellRow) cellRow {
	key := uuid.NewString()
	setting := f.setting
	if kill == "during" {
		setting.Hold = "60s" // until the test sets the faults again
	}
	c.venue.setFaults(t, setting)
	latency := time.Duration(0)
	if kill == "before" {
		latency = time.Minute // the server dies in it
	}
	p := rt.start(t, c, latency)
	auth := rt.auth(t, c, p)
	var mu sync.Mutex
	current := p
	base := func() string { mu.Lock(); defer mu.Unlock(); return "http://" + current.addr }
	restart := func() {
		p.kill()
		np := rt.start(t, c, 0)
		mu.Lock()
		current = np
		mu.Unlock()
	}

	requests := 0
	first := make(chan struct{})
	switch kill {
	case "none":
		close(first)
	case "after":
		a, err := sendOrder(context.Background(), base(), key, auth, qty)
		t.Logf("first attempt: %v %v", a, err)
		requests++
		close(first)
		restart()
	default:
		before := c.venue.state(t).Received
		go func() {
			defer close(first)
			// Its server dies under it (an error). A 503 is a claim refused
			// before the order left the server (a loaded machine's store
			// timeout), or the venue call's own timeout (Unsettled): the
			// client sends it again, as a client honouring Retry-After
			// would, or the wait below for the claim or the venue's order
			// would never end.
			for range 20 {
				a, err := sendOrder(context.Background(), base(), key, auth, qty)
				if err != nil || a.Status != http.StatusServiceUnavailable {
					return
				}
				time.Sleep(max(a.RetryAfter, 100*time.Millisecond)) // the contract's Retry-After, not a synchronisation
			}
		}()
		requests++
		if kill == "before" {
			waitUntil(t, "the order's claim", func() bool { return rt.claimed(t, c, key) })
			if got := c.venue.state(t).Received; got != before {
				t.Fatalf("the venue received %d orders before the kill, want none", got-before)
			}
			restart()
		} else {
			waitUntil(t, "the venue to hold the order", func() bool { return c.venue.state(t).Received > before })
			restart()
			c.venue.release(t, f.setting)
			waitUntil(t, "the held order to meet its fault", func() bool { return c.venue.state(t).Faults.Fault == "" })
		}
	}
	final, n, err := settle(base, key, auth, qty)
	<-first
	if err != nil {
		t.Fatal(err)
	}
	row.requests = requests + n
	row.final = final.String()
	orders := c.venue.ordersByQty(t)[fmt.Sprint(qty)]
	row.orders = len(orders)

	switch {
	case final.Error == "idempotency_outcome_unknown":
		t.Errorf("final answer %v while the venue answers lookups", final)
	case len(orders) > 1:
		t.Errorf("the venue holds %d orders for one key: %v", len(orders), orders)
	case final.Status == http.StatusCreated:
		if len(orders) != 1 {
			t.Fatalf("final answer 201, the venue holds %d orders", len(orders))
		}
		o := orders[0]
		if final.Body["client_order_id"] != o.ClientOrderID || fmt.Sprint(final.Body["fill_price"]) != strings.TrimRight(strings.TrimRight(o.FilledAvgPrice, "0"), ".") || final.Body["status"] != "filled" {
			t.Errorf("answer %v does not show the venue's order %+v", final.Body, o)
		}
	case len(orders) != 0:
		t.Errorf("final answer %v (an error), the venue holds %d orders", final, len(orders))
	}
	// Every fault here is passing: the venue recovers, so the client ends
	// with its order.
	if final.Status != http.StatusCreated {
		t.Errorf("final answer %v, want 201 once the venue recovered", final)
	}
	return row
}

// printTable logs the cells as a table, per fault.
func printTable(t *testing.T, rows []cellRow) {
	rank := map[string]int{"transactional": 0, "ordinary": 1}
	for i, f := range venueFaults {
		rank[f.name] = i
	}
	for i, k := range killPoints {
		rank[k] = i
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.route != b.route {
			return rank[a.route] < rank[b.route]
		}
		if a.fault != b.fault {
			return rank[a.fault] < rank[b.fault]
		}
		return rank[a.kill] < rank[b.kill]
	})
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-14s %-21s %-7s %-12s %-14s %-9s %s\n", "route", "venue fault", "kill -9", "venue orders", "final answer", "requests", "note")
	for _, r := range rows {
		orders, requests := fmt.Sprint(r.orders), fmt.Sprint(r.requests)
		if r.note != "" {
			orders, requests = "-", "-"
		}
		fmt.Fprintf(&b, "%-14s %-21s %-7s %-12s %-14s %-9s %s\n", r.route, r.fault, r.kill, orders, r.final, requests, r.note)
	}
	t.Log(b.String())
}

// TestVenueStorm: duplicates of each key race across two server processes
// while the venue drops the response of every order it books. The first
// execution's outcome is unknown; every duplicate retries until one runs
// again under the same client_order_id, the venue refuses the duplicate id,
// and the order is looked up. Per key: one venue order, and every client's
// final answer is that order.
func TestVenueStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the venue and the example server")
	}
	t.Parallel()
	const keys, clientsPerKey = 6, 6
	venueBin, serverBin := buildBinaries(t)
	var mu sync.Mutex
	var lines []string
	t.Run("routes", func(t *testing.T) {
		for _, rt := range []liveRoute{exampleRoute, ordinaryRoute} {
			t.Run(rt.name, func(t *testing.T) {
				t.Parallel()
				c := newCell(t, venueBin, serverBin)
				c.venue.setFaults(t, faultSetting{Fault: faultDrop}) // every booked order, no count
				servers := []*proc{rt.start(t, c, 0), rt.start(t, c, 0)}
				auth := rt.auth(t, c, servers[0])
				type result struct {
					key      int
					a        answer
					requests int
					err      error
				}
				results := make(chan result, keys*clientsPerKey)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for k := range keys {
					key := uuid.NewString()
					for i := range clientsPerKey {
						srv := servers[i%2]
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							a, n, err := settle(func() string { return "http://" + srv.addr }, key, auth, k+1)
							results <- result{k, a, n, err}
						}()
					}
				}
				close(start)
				wg.Wait()
				close(results)
				finals := map[int][]answer{}
				requests := 0
				for r := range results {
					if r.err != nil {
						t.Fatalf("key %d: %v", r.key, r.err)
					}
					finals[r.key] = append(finals[r.key], r.a)
					requests += r.requests
				}
				byQty := c.venue.ordersByQty(t)
				summary := map[string]int{}
				for k := range keys {
					orders := byQty[fmt.Sprint(k+1)]
					if len(orders) != 1 {
						t.Errorf("key %d: the venue holds %d orders, want 1", k, len(orders))
						continue
					}
					for _, a := range finals[k] {
						summary[a.String()]++
						if a.Status != http.StatusCreated || a.Body["client_order_id"] != orders[0].ClientOrderID {
							t.Errorf("key %d: final answer %v %v, want 201 with the venue's order %s", k, a, a.Body, orders[0].ClientOrderID)
						}
						if id := finals[k][0].Body["id"]; a.Body["id"] != id {
							t.Errorf("key %d: answers name orders %v and %v", k, id, a.Body["id"])
						}
					}
				}
				mu.Lock()
				lines = append(lines, fmt.Sprintf("%-14s keys %d, clients %d over 2 servers, venue orders %d, final answers %v, requests %d",
					rt.name, keys, keys*clientsPerKey, c.venue.state(t).Orders, summary, requests))
				mu.Unlock()
			})
		}
	})
	sort.Strings(lines)
	t.Log("\n" + strings.Join(lines, "\n"))
}
