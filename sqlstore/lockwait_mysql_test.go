package sqlstore_test

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// TestMySQLLockWaitIsNoOutage: a fail-open route whose claim waits behind
// a lock another session holds on a healthy MariaDB (LOCK TABLES ...
// WRITE, FLUSH TABLES WITH READ LOCK, an ALTER TABLE waiting for its
// metadata lock) answers 503 and never runs its handler: the outage
// probe's new connection answers DO 0, so there is no evidence of an
// outage (DESIGN.md "A bypass needs a dial that failed"). The answer
// comes within two store timeouts and a margin. FLUSH TABLES WITH READ
// LOCK holds every table of the server, so that case runs alone and
// briefly.
func TestMySQLLockWaitIsNoOutage(t *testing.T) {
	for _, c := range []struct {
		name string
		hold func(t *testing.T, db *sql.DB) (release func())
	}{
		{"LOCK TABLES WRITE", func(t *testing.T, db *sql.DB) func() {
			return holdOn(t, db, "LOCK TABLES idempotency_keys WRITE", "UNLOCK TABLES")
		}},
		{"FLUSH TABLES WITH READ LOCK", func(t *testing.T, db *sql.DB) func() {
			return holdOn(t, db, "FLUSH TABLES WITH READ LOCK", "UNLOCK TABLES")
		}},
		{"DDL waiting for its metadata lock", holdDDL},
	} {
		t.Run(c.name, func(t *testing.T) {
			const storeTimeout = 300 * time.Millisecond
			d := newMySQLDB(t)
			s, err := sqlstore.New(t.Context(), d.open(t, 4), sqlstore.Config{Dialect: sqlstore.MySQL})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var observed []idempotency.Observation
			mw, err := idempotency.New(s, idempotency.Config{StoreTimeout: storeTimeout, Lease: 3 * time.Second,
				Logger: slog.New(slog.DiscardHandler), Observer: func(_ context.Context, o idempotency.Observation) {
					mu.Lock()
					observed = append(observed, o)
					mu.Unlock()
				}})
			if err != nil {
				t.Fatal(err)
			}
			route, err := mw.Route(idempotency.RouteConfig{FailOpen: true})
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int32
			billing := route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			release := c.hold(t, d.open(t, 2))
			start := time.Now()
			var code int
			var body string
			answered := make(chan struct{})
			go func() { defer close(answered); code, body, _ = post(t, billing, uuid.NewString(), `{}`) }()
			select {
			case <-answered:
			case <-time.After(20 * storeTimeout):
				t.Fatalf("TestMySQLLockWaitIsNoOutage/%s: no answer within %v", c.name, 20*storeTimeout)
			}
			took := time.Since(start)
			release()
			if code != http.StatusServiceUnavailable || ran.Load() != 0 {
				t.Fatalf("fail-open claim behind %s: %d %s, handler runs %d; want 503 and no run", c.name, code, body, ran.Load())
			}
			if bound := 2*storeTimeout + 5*storeTimeout; took > bound {
				t.Errorf("the answer took %v, want within %v", took, bound)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(observed) != 1 || observed[0].Outcome != idempotency.OutcomeRejected {
				t.Errorf("observations %+v, want one rejected", observed)
			}
		})
	}
}

// holdOn runs lock on a connection of its own and returns the function
// that runs unlock on it.
func holdOn(t *testing.T, db *sql.DB, lock, unlock string) func() {
	t.Helper()
	c, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(t.Context(), lock); err != nil {
		t.Fatalf("%s: %v", lock, err)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			if _, err := c.ExecContext(context.Background(), unlock); err != nil {
				t.Errorf("%s: %v", unlock, err)
			}
			_ = c.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// holdDDL leaves an ALTER TABLE of the store's table waiting for its
// metadata lock behind an open transaction that read the table: every
// statement on the table then queues behind the ALTER.
func holdDDL(t *testing.T, db *sql.DB) func() {
	t.Helper()
	reader, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"START TRANSACTION", "SELECT COUNT(*) FROM idempotency_keys"} {
		if _, err := reader.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	altered := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(context.Background(), "ALTER TABLE idempotency_keys ADD COLUMN lock_wait_test INT NULL")
		altered <- err
	}()
	// The ALTER must be waiting before the claim is sent: the server's
	// process list is the only place that says so.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := reader.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND STATE LIKE 'Waiting for table metadata lock%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("holdDDL: the ALTER TABLE was not waiting for its metadata lock within 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state: there is nothing to wait on
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			_, _ = reader.ExecContext(context.Background(), "ROLLBACK")
			_ = reader.Close()
			select {
			case err := <-altered:
				if err != nil {
					t.Errorf("ALTER TABLE: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("holdDDL: the ALTER TABLE did not finish within 10s of the lock's release")
			}
		})
	}
	t.Cleanup(release)
	return release
}
