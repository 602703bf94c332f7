package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// heldConnector is a driver.Connector whose connects wait, once hold is
// set, until gate is closed or their context ends: a pool still opening
// its connections to a healthy database.
type heldConnector struct {
	driver.Connector
	hold atomic.Bool
	gate chan struct{}
}

func (c *heldConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if c.hold.Load() {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.Connector.Connect(ctx)
}

// TestPostgresPoolOpeningIsNoOutage: on sqlstore's PostgreSQL dialect, a
// burst under a short store timeout while database/sql is still opening
// its connections to a healthy database is 503 pool_exhausted on a
// fail-open route: no probe, no bypass, no run (DESIGN-settled-r4 item 4).
func TestPostgresPoolOpeningIsNoOutage(t *testing.T) {
	t.Parallel()
	const n, storeTimeout = 12, 200 * time.Millisecond
	cfg, err := pgx.ParseConfig(testdb.NewDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	conn := &heldConnector{Connector: stdlib.GetConnector(*cfg), gate: make(chan struct{})}
	var once sync.Once
	open := func() { once.Do(func() { close(conn.gate) }) }
	t.Cleanup(open)
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(4)
	s := pgStore(t, db)
	conn.hold.Store(true)
	db.SetMaxIdleConns(-1) // the connections New opened go
	db.SetMaxIdleConns(4)

	var mu sync.Mutex
	reasons := map[string]int{}
	mw, err := idempotency.New(s, idempotency.Config{StoreTimeout: storeTimeout, Lease: 3 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Observer: func(_ context.Context, o idempotency.Observation) {
			mu.Lock()
			reasons[string(o.Outcome)+"/"+o.StoreReason]++
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
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = post(t, billing, uuid.NewString(), `{}`)
		}()
	}
	answered := make(chan struct{})
	go func() { wg.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(20 * storeTimeout):
		t.Fatalf("TestPostgresPoolOpeningIsNoOutage: the burst was not answered within %v", 20*storeTimeout)
	}
	open()
	for i, code := range codes {
		if code != http.StatusServiceUnavailable {
			t.Errorf("request %d while the pool was opening: %d, want 503", i, code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if ran.Load() != 0 || reasons["rejected/"+idempotency.ReasonPoolExhausted] != n {
		t.Errorf("handler runs %d, outcomes %v; want none, and %d rejected with pool_exhausted", ran.Load(), reasons, n)
	}
}

// TestPostgresStatementTimeoutClass: a claim the server cancels at the
// session's statement_timeout (57014), behind a table lock, is
// statement_timeout on both database/sql drivers, as on the pgx store:
// one class table.
func TestPostgresStatementTimeoutClass(t *testing.T) {
	t.Parallel()
	for _, drv := range pgDrivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.NewDSN(t)
			locker, err := sql.Open(drv, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = locker.Close() })
			db, err := sql.Open(drv, dsn+"&statement_timeout=100")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			s := pgStore(t, db)
			tx, err := locker.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(t.Context(), `LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err = s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
			if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonStatementTimeout {
				t.Fatalf("a claim cancelled by statement_timeout: %q (%v), want statement_timeout", r, err)
			}
		})
	}
}
