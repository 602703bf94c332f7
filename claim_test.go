package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestOneKeyManyGoroutines: 200 concurrent requests with one key execute the
// handler exactly once; every other answer is a replay or a 409 in flight.
func TestOneKeyManyGoroutines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	const n = 200
	start := make(chan struct{})
	codes := make(chan *httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes <- send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	var fresh, replays, inFlight int
	for w := range codes {
		switch {
		case w.Code == 201 && w.Header().Get(HeaderReplayed) == "true":
			replays++
		case w.Code == 201:
			fresh++
		case w.Code == 409 && strings.Contains(w.Body.String(), "idempotency_in_flight"):
			inFlight++
		default:
			t.Fatalf("unexpected answer %d %s", w.Code, w.Body)
		}
	}
	if h.calls.Load() != 1 || fresh != 1 || replays+inFlight != n-1 {
		t.Fatalf("calls=%d fresh=%d replays=%d inFlight=%d", h.calls.Load(), fresh, replays, inFlight)
	}
}

// TestStoreTimeouts: a store that never answers is given up on at the
// store deadline (the claim's context carries it), so a fail-closed route
// answers 503 without running the handler, and a fail-open route runs it
// and counts a bypass. The wall-clock bound only proves nothing hangs.
func TestStoreTimeouts(t *testing.T) {
	t.Parallel()
	const storeTimeout, hang = 50 * time.Millisecond, 5 * time.Second
	h := newHarness(t, Config{StoreTimeout: storeTimeout, Lease: time.Second})
	h.store.block.Store(true)
	down := error(&StoreError{Op: "probe", Reason: ReasonConnection, Err: errors.New("connection refused")})
	h.store.probe.Store(&down) // the outage probe fails too: the bypass's evidence
	closed := h.route(RouteConfig{Name: "orders"}, orderHandler)
	open := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	// sendTimed sends one request and checks the blocked claim's deadline
	// was the store timeout from when the claim began.
	sendTimed := func(rt http.Handler, path string) *httptest.ResponseRecorder {
		t.Helper()
		h.store.blocked.Store(nil)
		before := time.Now()
		answered := make(chan *httptest.ResponseRecorder, 1)
		go func() { answered <- send(t, rt, "POST", path, testKey, `{}`) }()
		var w *httptest.ResponseRecorder
		select { // its own deadline: a claim without the store's would wait for ever
		case w = <-answered:
		case <-time.After(hang):
			t.Fatalf("%s: no answer after %v: a blocked store held the request", path, hang)
		}
		b := h.store.blocked.Load()
		if b == nil {
			t.Fatalf("%s: the claim never reached the store", path)
		}
		if d := b[1]; d.Before(before.Add(storeTimeout)) || d.After(b[0].Add(storeTimeout)) {
			t.Fatalf("%s: the claim's deadline is %v after the request began, want the store timeout %v from the claim",
				path, d.Sub(before), storeTimeout)
		}
		return w
	}

	w := sendTimed(closed, "/orders")
	assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
	if h.calls.Load() != 0 {
		t.Fatal("fail-closed ran the handler")
	}
	w = sendTimed(open, "/billing")
	if w.Code != 201 || h.calls.Load() != 1 {
		t.Fatalf("fail-open: %d, calls %d", w.Code, h.calls.Load())
	}
	if counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", "store_unavailable")) != 1 ||
		counter(t, h.mw.metrics.storeErrors.WithLabelValues("claim", "timeout")) != 2 {
		t.Fatal("bypass or timeouts not counted")
	}
}

// TestDataErrors: a store that refuses a request's values is not down. The
// record is not retried until the lease runs out (the client would wait for
// nothing), and a refused claim is a 400 on both policies: a fail-open route
// does not bypass (every retry would run).
func TestDataErrors(t *testing.T) {
	t.Parallel()
	quietLog := slog.New(slog.NewTextHandler(io.Discard, nil))

	t.Run("RecordNotRetried", func(t *testing.T) {
		t.Parallel()
		s := &dataErrorStore{MemoryStore: NewMemoryStore()}
		mw, err := New(s, Config{Lease: time.Minute, StoreTimeout: time.Second, Registerer: prometheus.NewRegistry(), Logger: quietLog})
		if err != nil {
			t.Fatal(err)
		}
		rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(orderHandler))
		w := send(t, rt, "POST", "/orders", testKey, `{}`)
		if w.Code != 201 {
			t.Fatalf("client did not get the real response: %d %s", w.Code, w.Body)
		}
		if n := s.completes.Load(); n != 1 {
			t.Errorf("Complete called %d times for a refused value, want 1", n)
		}
		if testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 1 {
			t.Error("record failure not counted")
		}
	})

	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("ClaimRefusedFailOpen=%v", failOpen), func(t *testing.T) {
			t.Parallel()
			s := &dataErrorStore{MemoryStore: NewMemoryStore(), claims: true}
			mw, err := New(s, Config{Registerer: prometheus.NewRegistry(), Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			rt := mw.MustRoute(RouteConfig{Name: "billing", FailOpen: failOpen})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			w := send(t, rt, "POST", "/billing", testKey, `{}`)
			// DESIGN.md: a value the store refuses is 400 on both
			// policies: a 503 would invite retries that cannot succeed.
			assertJSONError(t, w, 400, `{"error":"idempotency_scope_invalid"}`)
			if n := testutil.ToFloat64(mw.metrics.rejections.WithLabelValues("billing", reasonInvalidScope)); n != 1 {
				t.Errorf("invalid_scope rejections = %v, want 1", n)
			}
			if calls.Load() != 0 {
				t.Errorf("handler ran %d times on a refused claim", calls.Load())
			}
			if n := testutil.ToFloat64(mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
				t.Errorf("bypasses = %v, want 0", n)
			}
		})
	}
}

// TestMemoryStoreFull: a full memory store refuses new keys with 503 on a
// fail-open route too, without running the handler: a client that fills
// the store on purpose must not earn a bypass. Stored keys still replay.
func TestMemoryStoreFull(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	MemoryMaxRows(2)(h.store.MemoryStore)
	billing := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	orders := h.route(RouteConfig{Name: "orders"}, orderHandler)
	keys := []string{uuid.NewString(), uuid.NewString()}
	for _, k := range keys {
		if w := send(t, billing, "POST", "/billing", k, `{"plan":"pro"}`); w.Code != 201 {
			t.Fatalf("below the cap: %d %s", w.Code, w.Body)
		}
	}

	for _, rt := range []struct {
		name string
		h    http.Handler
	}{{"billing", billing}, {"orders", orders}} {
		w := send(t, rt.h, "POST", "/x", uuid.NewString(), `{"plan":"pro"}`)
		assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
		if w.Header().Get("Retry-After") != "1" {
			t.Errorf("%s: Retry-After %q, want 1", rt.name, w.Header().Get("Retry-After"))
		}
		if n := counter(t, h.mw.metrics.rejections.WithLabelValues(rt.name, reasonStoreUnavailable)); n != 1 {
			t.Errorf("%s: store_unavailable rejections = %v, want 1", rt.name, n)
		}
	}
	if n := h.calls.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2: a full store was bypassed", n)
	}
	if n := counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
		t.Errorf("bypasses = %v, want 0", n)
	}
	if n := counter(t, h.mw.metrics.storeErrors.WithLabelValues("claim", ReasonFull)); n != 2 {
		t.Errorf("store errors (claim, full) = %v, want 2", n)
	}

	// The stored keys replay; once they expire, new keys are served again.
	w := send(t, billing, "POST", "/billing", keys[0], `{"plan":"pro"}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("replay in a full store: %d, replayed %q", w.Code, w.Header().Get(HeaderReplayed))
	}
	h.clock.Advance(DefaultTTL + time.Minute)
	if w := send(t, billing, "POST", "/billing", uuid.NewString(), `{"plan":"pro"}`); w.Code != 201 || h.calls.Load() != 3 {
		t.Errorf("after the keys expired: %d, %d handler runs", w.Code, h.calls.Load())
	}
}

// TestContentionIsInFlight: a claim that loses to contention (the store's
// conflict reason) answers 409 in flight on both policies: never a
// fail-open bypass, which would run the handler while another request owns
// the key, and never 503.
func TestContentionIsInFlight(t *testing.T) {
	t.Parallel()
	for _, expired := range []bool{false, true} {
		for _, failOpen := range []bool{false, true} {
			t.Run(fmt.Sprintf("takeover=%v/FailOpen=%v", expired, failOpen), func(t *testing.T) {
				t.Parallel()
				mw, rt, calls := countedRoute(t, &contentionStore{MemoryStore: NewMemoryStore(), expired: expired},
					RouteConfig{Name: "billing", FailOpen: failOpen})
				w := send(t, rt, "POST", "/billing", testKey, `{}`)
				assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
				if w.Header().Get("Retry-After") != "5" {
					t.Errorf("Retry-After = %q, want 5", w.Header().Get("Retry-After"))
				}
				if calls.Load() != 0 {
					t.Errorf("handler ran %d times while another request owned the key", calls.Load())
				}
				if n := testutil.ToFloat64(mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 0 {
					t.Errorf("bypasses = %v, want 0", n)
				}
				if n := testutil.ToFloat64(mw.metrics.conflicts.WithLabelValues("billing", reasonInFlight)); n != 1 {
					t.Errorf("in-flight conflicts = %v, want 1", n)
				}
			})
		}
	}
}

// TestMismatchCheckedBeforeStatus: a different body on a key in any state
// (in flight, stale, failed, completed without a stored body) is 422, never
// the 409 that key's state would answer to the same body.
func TestMismatchCheckedBeforeStatus(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"in flight", "stale", "failed", "not stored"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			started, release := make(chan struct{}), make(chan struct{})
			rt := h.route(RouteConfig{Name: "orders", MaxResponseBytes: 4}, func(w http.ResponseWriter, r *http.Request) {
				switch state {
				case "in flight", "stale":
					close(started)
					<-release
				case "failed":
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				orderHandler(w, r) // longer than MaxResponseBytes: not stored
			})
			done := make(chan struct{})
			go func() { defer close(done); send(t, rt, "POST", "/orders", testKey, `{"a":1}`) }()
			switch state {
			case "in flight":
				<-started
			case "stale":
				<-started
				h.clock.Advance(DefaultLease + time.Second)
			default:
				<-done
			}
			w := send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
			assertJSONError(t, w, 422, `{"error":"idempotency_key_body_mismatch"}`)
			// The same body gets the state's own answer: the key is in the
			// state this case is about.
			want := map[string]string{"in flight": "idempotency_in_flight", "stale": "idempotency_outcome_unknown",
				"failed": "idempotency_previous_failed", "not stored": "idempotency_response_not_stored"}[state]
			if w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`); w.Code != 409 || !strings.Contains(w.Body.String(), want) {
				t.Fatalf("same body: %d %s, want 409 %s", w.Code, w.Body, want)
			}
			close(release)
			<-done
			if h.calls.Load() != 1 || counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", reasonBodyMismatch)) != 1 {
				t.Fatalf("calls %d, body_mismatch %v; want 1 and 1", h.calls.Load(),
					counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", reasonBodyMismatch)))
			}
		})
	}
}

// racingStore shows every claim an expired row and loses every takeover
// of it: other requests keep winning the key.
type racingStore struct {
	*MemoryStore
	takeovers atomic.Int64
}

func (s *racingStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	return ClaimResult{Record: Record{ID: 7, Attempt: 1, Status: StatusCompleted, Expired: true, RequestHash: req.RequestHash}}, nil
}

func (s *racingStore) Takeover(context.Context, Fence, ClaimRequest) (ClaimResult, error) {
	s.takeovers.Add(1)
	return ClaimResult{Lost: true}, nil // lost the race
}

// TestClaimRoundsAreBounded: a request whose takeover keeps losing claims
// again a bounded number of times, then answers 409 in flight (others keep
// winning the key), on both policies, without running the handler.
func TestClaimRoundsAreBounded(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			t.Parallel()
			s := &racingStore{MemoryStore: NewMemoryStore()}
			mw, rt, calls := countedRoute(t, s, RouteConfig{Name: "orders", FailOpen: failOpen})
			w := send(t, rt, "POST", "/orders", testKey, `{}`)
			assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
			if n := s.takeovers.Load(); n != maxClaimRounds-1 {
				t.Errorf("takeovers tried %d times, want %d (every round but the last)", n, maxClaimRounds-1)
			}
			if calls.Load() != 0 {
				t.Errorf("handler ran %d times while others kept winning the key", calls.Load())
			}
			if n := testutil.ToFloat64(mw.metrics.hit.WithLabelValues("orders")); n != 1 {
				t.Errorf("hits = %v, want 1", n)
			}
		})
	}
}
