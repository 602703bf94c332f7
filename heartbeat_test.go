package idempotency

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The heartbeat's branching, on a MemoryStore with the real clock: what
// the engine does when Renew succeeds, finds the key gone, or fails. The
// real stores' renewal is in idempotencytest (Renew) and
// heartbeat_pg_test.go.

const (
	hbLease        = time.Second
	hbStoreTimeout = 100 * time.Millisecond
)

// renewStore is a MemoryStore whose Renew may be replaced, counting the
// renewals and the records (Complete, Fail).
type renewStore struct {
	*MemoryStore
	renew            func(ctx context.Context) error // nil: the memory store's
	renews, recorded atomic.Int64
}

func (s *renewStore) Renew(ctx context.Context, f Fence, req ClaimRequest) error {
	s.renews.Add(1)
	if s.renew != nil {
		return s.renew(ctx)
	}
	return s.MemoryStore.Renew(ctx, f, req)
}

func (s *renewStore) Complete(ctx context.Context, f Fence, owner Record, resp Response) error {
	s.recorded.Add(1)
	return s.MemoryStore.Complete(ctx, f, owner, resp)
}

func (s *renewStore) Fail(ctx context.Context, f Fence) error {
	s.recorded.Add(1)
	return s.MemoryStore.Fail(ctx, f)
}

// hbRoute is a Heartbeat route over s whose handler runs h.
func hbRoute(t *testing.T, s Store, reg *prometheus.Registry, h http.HandlerFunc) http.Handler {
	t.Helper()
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mw := newHooked(t, s, Config{Lease: hbLease, StoreTimeout: hbStoreTimeout, Registerer: reg})
	return mw.MustRoute(RouteConfig{Heartbeat: true, MaxRun: 30 * time.Second})(h)
}

func hbSend(h http.Handler, key string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"amount":10}`))
	r.Header.Set(HeaderKey, key)
	h.ServeHTTP(w, r)
	return w
}

// TestHeartbeatHandlerOutlivesTheLease: a handler running five leases
// completes and is recorded once; meanwhile a duplicate every 100 ms
// through a second middleware is answered 409 in flight, never runs,
// never finds the key stale.
func TestHeartbeatHandlerOutlivesTheLease(t *testing.T) {
	t.Parallel()
	store := &renewStore{MemoryStore: NewMemoryStore()}
	var runs atomic.Int64
	entered := make(chan struct{})
	first := hbRoute(t, store, nil, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
		}
		select {
		case <-time.After(5 * hbLease): // the work: five leases long
		case <-r.Context().Done():
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	second := hbRoute(t, store, nil, func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- hbSend(first, testKey) }()
	<-entered
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	tries := 0
	for {
		select {
		case w := <-done:
			if w.Code != http.StatusCreated {
				t.Fatalf("the long handler answered %d %s, want 201", w.Code, w.Body)
			}
			if tries < 10 {
				t.Errorf("only %d duplicates were sent while the handler ran", tries)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want 1", n)
			}
			if n := store.recorded.Load(); n != 1 {
				t.Errorf("%d records, want 1", n)
			}
			if n := store.renews.Load(); n < 10 {
				t.Errorf("%d renewals over five leases, want at least 10 (every third)", n)
			}
			if w := hbSend(second, testKey); w.Code != http.StatusCreated || w.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("retry after the record: %d %q, want the replay", w.Code, w.Header().Get(HeaderReplayed))
			}
			return
		case <-tick.C:
			tries++
			w := hbSend(second, testKey)
			if w.Header().Get(HeaderReplayed) == "true" { // the record landed as the ticker fired
				continue
			}
			if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
				t.Fatalf("duplicate %d while the handler runs: %d %s, want 409 idempotency_in_flight", tries, w.Code, w.Body)
			}
		}
	}
}

// TestHeartbeatLostLease: a renewal that finds the key no longer owned, or
// renewals failing until the last confirmed lease less the store timeout,
// cancel the handler (cause ErrLeaseLost) before the lease lapses; nothing
// is recorded; the answer is 503 with Retry-After and counted under
// lease_lost.
func TestHeartbeatLostLease(t *testing.T) {
	t.Parallel()
	for name, renew := range map[string]func(context.Context) error{
		"not owner": func(context.Context) error { return ErrNotOwner },
		"store failing": func(ctx context.Context) error {
			<-ctx.Done() // a store that never answers: each renewal runs out its deadline
			return &StoreError{Op: "renew", Reason: ReasonTimeout, Err: ctx.Err()}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &renewStore{MemoryStore: NewMemoryStore(), renew: renew}
			reg := prometheus.NewRegistry()
			var cause error
			var cancelled time.Time
			start := time.Now()
			h := hbRoute(t, store, reg, func(w http.ResponseWriter, r *http.Request) {
				<-r.Context().Done()
				cancelled, cause = time.Now(), context.Cause(r.Context())
				w.WriteHeader(http.StatusCreated) // too late: never recorded, never sent
			})
			w := hbSend(h, testKey)
			if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "idempotency_store_unavailable") || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("answer after a lost lease: %d %s Retry-After %q, want 503 idempotency_store_unavailable, Retry-After 1", w.Code, w.Body, w.Header().Get("Retry-After"))
			}
			if !errors.Is(cause, ErrLeaseLost) {
				t.Errorf("the handler's context cause: %v, want ErrLeaseLost", cause)
			}
			if lapse := start.Add(hbLease); !cancelled.Before(lapse) {
				t.Errorf("the handler was cancelled %v after the claim, at or past its lease (%v)", cancelled.Sub(start), hbLease)
			}
			if n := store.recorded.Load(); n != 0 {
				t.Errorf("%d records after a lost lease, want none", n)
			}
			if n := gatheredValue(t, reg, "idempotency_rejections_total", "reason", "lease_lost"); n != 1 {
				t.Errorf("idempotency_rejections_total{reason=lease_lost} = %v, want 1", n)
			}
			if n := gatheredValue(t, reg, "idempotency_record_failures_total", "", ""); n != 1 {
				t.Errorf("idempotency_record_failures_total = %v, want 1", n)
			}
		})
	}
}

// TestHeartbeatDoLeaseLost: Do's call whose lease is lost returns
// ErrLeaseLost, which matches ErrStoreUnavailable, and records nothing.
func TestHeartbeatDoLeaseLost(t *testing.T) {
	t.Parallel()
	store := &renewStore{MemoryStore: NewMemoryStore(), renew: func(context.Context) error { return ErrNotOwner }}
	mw := newHooked(t, store, Config{Lease: hbLease, StoreTimeout: hbStoreTimeout})
	op, err := mw.Operation("charge", RouteConfig{Heartbeat: true, MaxRun: 30 * time.Second, MinKeyLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Do(context.Background(), op, Call{Key: testKey}, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 1, nil
	})
	var ea *ErrorAnswer
	if !errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrStoreUnavailable) || !errors.As(err, &ea) || ea.Status != 503 {
		t.Fatalf("Do after a lost lease: %v, want an *ErrorAnswer 503 matching ErrLeaseLost and ErrStoreUnavailable", err)
	}
	if n := store.recorded.Load(); n != 0 {
		t.Errorf("%d records after a lost lease, want none", n)
	}
}

// TestHeartbeatConstruction: Heartbeat needs MaxRun, above the lease and at
// most TTL/2, and no transaction; MaxRun needs Heartbeat.
func TestHeartbeatConstruction(t *testing.T) {
	t.Parallel()
	mw := newHooked(t, NewMemoryStore(), Config{Lease: 10 * time.Second, StoreTimeout: time.Second})
	for _, c := range []struct {
		rc   RouteConfig
		want string // "" accepted, else in the error
	}{
		{RouteConfig{Heartbeat: true, MaxRun: time.Minute}, ""},
		{RouteConfig{Heartbeat: true, MaxRun: 12 * time.Hour}, ""}, // TTL/2 of the default 24h
		{RouteConfig{Heartbeat: true}, "needs RouteConfig.MaxRun"},
		{RouteConfig{Heartbeat: true, MaxRun: 10 * time.Second}, "must exceed Config.Lease"},
		{RouteConfig{Heartbeat: true, MaxRun: 5 * time.Second}, "must exceed Config.Lease"},
		{RouteConfig{Heartbeat: true, MaxRun: -time.Minute}, "must exceed Config.Lease"},
		{RouteConfig{Heartbeat: true, MaxRun: 12*time.Hour + time.Second}, "at most half of RouteConfig.TTL"},
		{RouteConfig{Heartbeat: true, MaxRun: 31 * time.Second, TTL: time.Minute}, "at most half of RouteConfig.TTL"},
		{RouteConfig{MaxRun: time.Minute}, "MaxRun needs RouteConfig.Heartbeat"},
		{RouteConfig{Heartbeat: true, MaxRun: time.Minute, Transactional: true}, "cannot be combined with Transactional"},
	} {
		_, err := mw.Route(c.rc)
		_, opErr := mw.Operation("op", withMinKey(c.rc))
		for entry, err := range map[string]error{"Route": err, "Operation": opErr} {
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%s(%+v): %v, want accepted", entry, c.rc, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("%s(%+v): %v, want an error with %q", entry, c.rc, err, c.want)
			}
		}
	}
}

func withMinKey(rc RouteConfig) RouteConfig { rc.MinKeyLength = 16; return rc }

// gatheredValue sums the series of counter name whose label has value
// ("" label: every series).
func gatheredValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := label == ""
			for _, l := range m.GetLabel() {
				ok = ok || l.GetName() == label && l.GetValue() == value
			}
			if ok {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
