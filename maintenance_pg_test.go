package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresMaintenanceRacingClaims runs erasure and cleanup while claims
// race: no handler ever runs without its in-flight row (so no live row is
// erased or cleaned up under it), two executions of one key never overlap,
// maintenance never errors, and every answer is a fresh 201, a replay or a
// 409 in flight. (A key retried after its row was erased is new, by design,
// so later executions of an erased key are allowed.)
func TestPostgresMaintenanceRacingClaims(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(16))
	store := idempotency.NewPostgresStore(pool)
	mw, err := idempotency.New(store, idempotency.Config{StoreTimeout: 20 * time.Second, Lease: time.Minute,
		Registerer: prometheus.NewRegistry(), Logger: quiet,
		Scope: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-User")
		},
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var active sync.Map // scope|key -> *atomic.Int32
	var problems atomic.Int64
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := idempotency.KeyFromContext(r.Context())
		scope := r.Header.Get("X-User")
		n, _ := active.LoadOrStore(scope+"|"+key, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) != 1 {
			t.Errorf("two executions of %s/%s overlap", scope, key)
			problems.Add(1)
		}
		defer n.(*atomic.Int32).Add(-1)
		var status string
		err := pool.QueryRow(r.Context(), `SELECT status FROM idempotency_keys WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = 'orders'`,
			key, scope).Scan(&status)
		if err != nil || status != "in_flight" {
			t.Errorf("handler of %s/%s runs without its in-flight row: %q %v", scope, key, status, err)
			problems.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))

	scopes := []string{"1", "2", "3", "4"}
	keys := newKeys(10)
	stop := make(chan struct{})
	var maint sync.WaitGroup
	var erased, cleaned atomic.Int64
	// Erasure of random scopes, and cleanup of rows that expire on their
	// own (claimed directly with a 1ms TTL and lease), all the time.
	maint.Add(2)
	go func() {
		defer maint.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			res, err := mw.Erase(context.Background(), scopes[i%len(scopes)])
			if err != nil {
				t.Errorf("erase: %v", err)
			}
			erased.Add(res.Deleted)
		}
	}()
	go func() {
		defer maint.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			req := idempotency.ClaimRequest{Key: uuid.NewString(), Scope: "expiring", Endpoint: "orders",
				RequestHash: strings.Repeat("0", 64), TTL: time.Millisecond, Lease: time.Millisecond}
			if _, err := store.Claim(context.Background(), req); err != nil {
				t.Errorf("seed: %v", err)
			}
			n, err := mw.Cleanup(context.Background(), 5)
			if err != nil {
				t.Errorf("cleanup: %v", err)
			}
			cleaned.Add(n)
		}
	}()

	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range len(scopes) * len(keys) * 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
			r.Header.Set(idempotency.HeaderKey, keys[i%len(keys)])
			r.Header.Set("X-User", scopes[(i/len(keys))%len(scopes)])
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 201 && !(w.Code == 409 && strings.Contains(w.Body.String(), "idempotency_in_flight")) {
				t.Errorf("unexpected answer %d %s", w.Code, w.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(stop)
	maint.Wait()
	if problems.Load() > 0 {
		t.Fatalf("%d invariant violations", problems.Load())
	}
	if erased.Load() == 0 || cleaned.Load() == 0 {
		t.Fatalf("maintenance did not race the claims: erased %d, cleaned %d", erased.Load(), cleaned.Load())
	}
	// Once the last seeded row has expired, cleanup removes them all.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var live int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE scope_user_id = 'expiring' AND locked_until >= now()`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("seeded rows never expired")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := mw.Cleanup(context.Background(), 1000); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE scope_user_id = 'expiring'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("expired rows left after cleanup: %d (%v)", left, err)
	}
}

// TestPostgresMaintenanceHonoursItsContext: Erase and Cleanup are the
// caller's calls, so a cancelled context stops them and changes nothing.
func TestPostgresMaintenanceHonoursItsContext(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true },
		Scope: func(context.Context) string { return "42" }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	if w := do(h, uuid.NewString(), `{}`); w.Code != 201 {
		t.Fatalf("order: %d %s", w.Code, w.Body)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := mw.Erase(cancelled, "42"); !errors.Is(err, context.Canceled) {
		t.Errorf("Erase with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := mw.Cleanup(cancelled, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("Cleanup with a cancelled context: %v, want context.Canceled", err)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Errorf("rows after the cancelled erase: %d, want 1", rows)
	}
}
