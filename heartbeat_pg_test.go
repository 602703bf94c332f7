package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// RouteConfig.Heartbeat on PostgreSQL: two middlewares, each with its own
// pool, stand for two processes sharing the table.

const (
	pgHBLease        = 2 * time.Second
	pgHBStoreTimeout = 500 * time.Millisecond
)

// pgHBRoute is a Heartbeat route over pool whose handler is h.
func pgHBRoute(t *testing.T, pool *pgxpool.Pool, reg *prometheus.Registry, h http.HandlerFunc) http.Handler {
	t.Helper()
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mw := newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{Lease: pgHBLease, StoreTimeout: pgHBStoreTimeout, Registerer: reg})
	return mw.MustRoute(idempotency.RouteConfig{Heartbeat: true, MaxRun: time.Minute})(h)
}

// secondPool is another pool on base's schema: another process's.
func secondPool(t *testing.T, base *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(t.Context(), base.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Ping(t.Context()); err != nil { // its first connection, before any store timeout runs
		t.Fatal(err)
	}
	return p
}

// created answers 201 with body.
func created(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprint(w, body)
}

// sendEntered sends key through h in the background until its handler
// has run (entered closed), sending again after a 503 that came before it
// ran (a claim this loaded machine did not answer within the store
// timeout), as a client honouring Retry-After would. It fails the test
// when the handler never runs; the channel carries the answer's status.
func sendEntered(t *testing.T, h http.Handler, key string, entered <-chan struct{}) (done <-chan int, start time.Time) {
	t.Helper()
	ch := make(chan int, 1)
	starts := make(chan time.Time, 8)
	go func() {
		code := 0
		for range 5 {
			starts <- time.Now()
			code = do(h, key, `{"a":1}`).Code
			select {
			case <-entered:
				ch <- code
				return
			default:
			}
			if code != http.StatusServiceUnavailable {
				break
			}
			time.Sleep(time.Second) // Retry-After, not a synchronisation
		}
		ch <- code
	}()
	for {
		select {
		case start = <-starts:
		case <-entered:
			for len(starts) > 0 {
				start = <-starts
			}
			return ch, start
		case code := <-ch:
			t.Fatalf("the handler never ran: answered %d", code)
		}
	}
}

// keyRow reads key's row: status, attempt and recorded body.
func keyRow(t *testing.T, pool *pgxpool.Pool, key string) (status string, attempt int32, body string) {
	t.Helper()
	var b []byte
	err := pool.QueryRow(t.Context(), `SELECT status, attempt, coalesce(convert_from(response_body, 'UTF8'), '') FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&status, &attempt, &b)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempt, string(b)
}

// TestHeartbeatPostgresOutlivesTheLease: a handler running five leases
// completes and records once; another middleware with its own pool tries
// the key every 100 ms meanwhile and never wins it (409 in flight every
// time, never outcome_unknown or a takeover).
func TestHeartbeatPostgresOutlivesTheLease(t *testing.T) {
	t.Parallel()
	base := testdb.New(t)
	var runs atomic.Int64
	entered := make(chan struct{})
	first := pgHBRoute(t, base, nil, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(entered)
		select {
		case <-time.After(5 * pgHBLease): // the work: five leases long
		case <-r.Context().Done():
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		created(w, `{"by":"first"}`)
	})
	second := pgHBRoute(t, secondPool(t, base), nil, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		created(w, `{"by":"second"}`)
	})
	key := uuid.NewString()
	done, _ := sendEntered(t, first, key, entered)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	tries, inFlight := 0, 0
	for waiting := true; waiting; {
		select {
		case code := <-done:
			if code != http.StatusCreated {
				t.Fatalf("the long handler answered %d, want 201", code)
			}
			waiting = false
		case <-tick.C:
			tries++
			// A 503 (this loaded machine's store timeout) wins nothing either.
			switch w := do(second, key, `{"a":1}`); {
			case w.Code == http.StatusConflict && strings.Contains(w.Body.String(), "idempotency_in_flight"):
				inFlight++
			case w.Header().Get(idempotency.HeaderReplayed) == "true": // the record landed as the ticker fired
			case w.Code != http.StatusServiceUnavailable:
				t.Fatalf("duplicate %d from the other process while the handler runs: %d %s, want 409 idempotency_in_flight", tries, w.Code, w.Body)
			}
		}
	}
	if tries < 20 || inFlight < tries/2 {
		t.Errorf("%d duplicates over five leases, %d of them answered in flight; want at least 20, most in flight", tries, inFlight)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	if status, attempt, body := keyRow(t, base, key); status != "completed" || attempt != 1 || !strings.Contains(body, "first") {
		t.Errorf("row: %s attempt %d body %s, want completed by the first owner, attempt 1", status, attempt, body)
	}
}

// TestHeartbeatPostgresCutRenewals: the link of the owner's pool is cut
// while its handler runs: the handler's context is cancelled before the
// lease lapses and the answer is 503. Another process waiting for the
// lease's end finds the key stale (outcome_unknown); once the key expires
// it takes it over and records, and the first owner never writes over it.
func TestHeartbeatPostgresCutRenewals(t *testing.T) {
	t.Parallel()
	base := testdb.New(t)
	proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", base.Config().ConnConfig.Host, base.Config().ConnConfig.Port))
	cfg := base.Config().Copy()
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = time.Second
	cut, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	reg := prometheus.NewRegistry()
	entered := make(chan struct{})
	var cancelled time.Time
	var cause error
	first := pgHBRoute(t, cut, reg, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		cancelled, cause = time.Now(), context.Cause(r.Context())
		created(w, `{"by":"first"}`)
	})
	var secondRuns atomic.Int64
	second := pgHBRoute(t, secondPool(t, base), nil, func(w http.ResponseWriter, r *http.Request) {
		secondRuns.Add(1)
		created(w, `{"by":"second"}`)
	})
	key := uuid.NewString()
	done, _ := sendEntered(t, first, key, entered)
	proxy.Cut()
	if code := <-done; code != http.StatusServiceUnavailable {
		t.Fatalf("the owner whose renewals were cut answered %d, want 503", code)
	}
	if !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Errorf("the handler's context cause: %v, want ErrLeaseLost", cause)
	}
	var lockedUntil time.Time // the lease the last renewal confirmed, by the database's clock (this machine's)
	if err := base.QueryRow(t.Context(), `SELECT locked_until FROM idempotency_keys WHERE idem_key = $1`, key).Scan(&lockedUntil); err != nil {
		t.Fatal(err)
	}
	if !cancelled.Before(lockedUntil) {
		t.Errorf("the handler was cancelled at %v, past its lease's end %v", cancelled, lockedUntil)
	}
	if n := gathered(t, reg, "idempotency_rejections_total", "unnamed", "lease_lost"); n != 1 {
		t.Errorf("idempotency_rejections_total{reason=lease_lost} = %v, want 1", n)
	}
	time.Sleep(time.Until(lockedUntil.Add(50 * time.Millisecond))) // waiting out the lease, as the other process would; not a synchronisation
	if w := do(second, key, `{"a":1}`); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_outcome_unknown") {
		t.Errorf("the other process after the lease: %d %s, want 409 idempotency_outcome_unknown", w.Code, w.Body)
	}
	// The key expires (its TTL forced over): the other process takes it over.
	if _, err := base.Exec(t.Context(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	if w := do(second, key, `{"a":1}`); w.Code != http.StatusCreated {
		t.Fatalf("the other process after expiry: %d %s, want its own 201", w.Code, w.Body)
	}
	if status, attempt, body := keyRow(t, base, key); status != "completed" || attempt != 2 || !strings.Contains(body, "second") {
		t.Errorf("row: %s attempt %d body %s, want completed by the second owner, attempt 2", status, attempt, body)
	}
}

// TestHeartbeatPostgresLostOwnership: the owner's lease is forced over
// and another process takes the key over while the handler runs: the
// owner's next renewal finds 0 rows under its fence, its handler is
// cancelled and answered 503, and only the new owner's record stands.
func TestHeartbeatPostgresLostOwnership(t *testing.T) {
	t.Parallel()
	base := testdb.New(t)
	reg := prometheus.NewRegistry()
	entered := make(chan struct{})
	var cause error
	first := pgHBRoute(t, base, reg, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		cause = context.Cause(r.Context())
		created(w, `{"by":"first"}`)
	})
	second := pgHBRoute(t, secondPool(t, base), nil, func(w http.ResponseWriter, r *http.Request) {
		created(w, `{"by":"second"}`)
	})
	key := uuid.NewString()
	done, _ := sendEntered(t, first, key, entered)
	if _, err := base.Exec(t.Context(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', retain_until = now() - interval '1 second', locked_until = now() - interval '1 second' WHERE idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	if w := do(second, key, `{"a":1}`); w.Code != http.StatusCreated {
		t.Fatalf("the takeover: %d %s, want its own 201", w.Code, w.Body)
	}
	if code := <-done; code != http.StatusServiceUnavailable {
		t.Fatalf("the owner that lost its key answered %d, want 503", code)
	}
	if !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Errorf("the handler's context cause: %v, want ErrLeaseLost", cause)
	}
	if n := gathered(t, reg, "idempotency_rejections_total", "unnamed", "lease_lost"); n != 1 {
		t.Errorf("idempotency_rejections_total{reason=lease_lost} = %v, want 1", n)
	}
	if status, attempt, body := keyRow(t, base, key); status != "completed" || attempt != 2 || !strings.Contains(body, "second") {
		t.Errorf("row: %s attempt %d body %s, want completed by the second owner, attempt 2", status, attempt, body)
	}
}
