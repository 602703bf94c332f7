package sqlstore_test

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// TestWaitInFlightPolls: database/sql has no notifications, so duplicates
// that wait (RouteConfig.WaitInFlight) learn of the owner's outcome by
// polling: the storm of issue #36 (32 copies of each key at once, a 200 ms
// handler, a 1 s wait) executes once per key and replays to every
// duplicate, on the PostgreSQL dialect (both drivers) and on MariaDB.
func TestWaitInFlightPolls(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) *sqlstore.Store{
		"mysql": func(t *testing.T) *sqlstore.Store { return newMySQLDB(t).store(t, 16) },
	}
	for _, driver := range pgDrivers {
		stores["postgres/"+driver] = func(t *testing.T) *sqlstore.Store { db, _ := pgDB(t, driver, 16); return pgStore(t, db) }
	}
	// One storm at a time: three at once on two cores under -race starve
	// each other's owners past the 1 s wait (the duplicates then answer
	// 409 in flight, as they should), which is not what this test is about.
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			var calls atomic.Int64
			h := newMiddleware(t, s, idempotency.Config{StoreTimeout: 5 * time.Second}).MustRoute(idempotency.RouteConfig{Name: "orders", WaitInFlight: time.Second})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					time.Sleep(200 * time.Millisecond) // the handler's work, not a synchronisation
					w.WriteHeader(http.StatusCreated)
				}))
			const keys, copies = 4, 32
			var fresh, replays, inFlight atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range keys {
				key := uuid.NewString()
				for range copies {
					wg.Go(func() {
						<-start
						code, body, hdr := post(t, h, key, `{}`)
						switch {
						case code == http.StatusCreated && hdr.Get(idempotency.HeaderReplayed) == "true":
							replays.Add(1)
						case code == http.StatusCreated:
							fresh.Add(1)
						case code == http.StatusConflict && strings.Contains(body, "idempotency_in_flight"):
							inFlight.Add(1)
						default:
							t.Errorf("%d %s", code, body)
						}
					})
				}
			}
			close(start)
			wg.Wait()
			t.Logf("storm on %s (%d keys x %d copies, 200 ms handler, 1 s wait): %d executions, %d fresh, %d replays, %d in flight",
				name, keys, copies, calls.Load(), fresh.Load(), replays.Load(), inFlight.Load())
			if calls.Load() != keys || fresh.Load() != keys || replays.Load() != keys*(copies-1) || inFlight.Load() != 0 {
				t.Errorf("want %d executions and fresh answers, %d replays, no 409", keys, keys*(copies-1))
			}
		})
	}
}
