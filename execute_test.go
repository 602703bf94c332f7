package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestHandlerOutcomes covers how each kind of handler answer is recorded.
func TestHandlerOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		rc          RouteConfig
		handler     http.HandlerFunc
		wantStatus  int
		wantBody    string // of the replay, or of the second answer
		wantCalls   int64  // after two identical requests
		wantReplay  bool
		wantHeaders map[string]string
	}{
		{name: "400 is deterministic and replayed",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				_, _ = w.Write([]byte(`{"error":"invalid_order"}`))
			},
			wantStatus: 400, wantBody: `{"idempotency_replayed":true,"error":"invalid_order"}`, wantCalls: 1, wantReplay: true},
		{name: "writing nothing completes as 200 with an empty body",
			handler:    func(w http.ResponseWriter, r *http.Request) {},
			wantStatus: 200, wantBody: ``, wantCalls: 1, wantReplay: true},
		{name: "a text body replays byte for byte",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = w.Write([]byte("  {\"not\": \"json\"}  \n"))
			},
			wantStatus: 200, wantBody: "  {\"not\": \"json\"}  \n", wantCalls: 1, wantReplay: true,
			wantHeaders: map[string]string{"Content-Type": "text/plain; charset=utf-8"}},
		{name: "a binary body replays byte for byte",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write([]byte{0, 1, 2, 0xff, 0xfe})
			},
			wantStatus: 200, wantBody: "\x00\x01\x02\xff\xfe", wantCalls: 1, wantReplay: true},
		{name: "a JSON array replays unchanged",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`[1,2]`))
			},
			wantStatus: 200, wantBody: `[1,2]`, wantCalls: 1, wantReplay: true},
		{name: "an empty JSON object gets the replay field",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(202)
				_, _ = w.Write([]byte(` {} `))
			},
			wantStatus: 202, wantBody: ` {"idempotency_replayed":true} `, wantCalls: 1, wantReplay: true},
		{name: "a body that already has the replay field replays as it is",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"idempotency_replayed":false}`))
			},
			wantStatus: 200, wantBody: `{"idempotency_replayed":false}`, wantCalls: 1, wantReplay: true},
		{name: "multi-valued replay headers are kept whole",
			rc: RouteConfig{ReplayHeaders: []string{"X-Multi"}},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("X-Multi", "a")
				w.Header().Add("X-Multi", "b")
				w.Header().Set("Authorization", "Bearer x")
				w.Header().Set("WWW-Authenticate", "Basic")
				w.Header().Set("Proxy-Authenticate", "Basic")
			},
			wantStatus: 200, wantBody: ``, wantCalls: 1, wantReplay: true,
			wantHeaders: map[string]string{"X-Multi": "a,b", "Authorization": "", "Www-Authenticate": "", "Proxy-Authenticate": ""}},
		{name: "429 releases the key",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
			},
			wantStatus: 429, wantBody: ``, wantCalls: 2},
		{name: "503 fails the key",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			wantStatus: 409, wantBody: `{"error":"idempotency_previous_failed"}`, wantCalls: 1},
		{name: "no-store route releases the key on completion",
			rc: RouteConfig{NoStore: true},
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(201)
				_, _ = w.Write([]byte("personal data"))
			},
			wantStatus: 201, wantBody: `personal data`, wantCalls: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			c.rc.Name = "r"
			rt := h.route(c.rc, c.handler)
			send(t, rt, "POST", "/r", testKey, `{"q":1}`)
			w := send(t, rt, "POST", "/r", testKey, `{"q":1}`)
			if w.Code != c.wantStatus || w.Body.String() != c.wantBody {
				t.Fatalf("second answer = %d %q, want %d %q", w.Code, w.Body, c.wantStatus, c.wantBody)
			}
			if got := h.calls.Load(); got != c.wantCalls {
				t.Fatalf("calls = %d, want %d", got, c.wantCalls)
			}
			if (w.Header().Get(HeaderReplayed) == "true") != c.wantReplay {
				t.Fatalf("Idempotent-Replayed = %q", w.Header().Get(HeaderReplayed))
			}
			for k, v := range c.wantHeaders {
				if got := strings.Join(w.Header().Values(k), ","); got != v {
					t.Fatalf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestPanicFailsKeyAndIsReraised(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) { panic("fill engine exploded") })
	func() {
		defer func() {
			if p := recover(); p != "fill engine exploded" {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		send(t, rt, "POST", "/r", testKey, `{}`)
		t.Fatal("panic was swallowed")
	}()
	w := send(t, rt, "POST", "/r", testKey, `{}`)
	assertJSONError(t, w, 409, `{"error":"idempotency_previous_failed"}`)
	if h.calls.Load() != 1 {
		t.Fatalf("calls = %d", h.calls.Load())
	}
}

// TestBadHandlers: a handler that writes an invalid status code or calls
// runtime.Goexit fails its key instead of poisoning it or escaping.
func TestBadHandlers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	bad := h.route(RouteConfig{Name: "bad"}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(42) })
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Fatal("an invalid status code did not panic")
			}
		}()
		send(t, bad, "POST", "/bad", testKey, `{}`)
	}()
	assertJSONError(t, send(t, bad, "POST", "/bad", testKey, `{}`), 409, `{"error":"idempotency_previous_failed"}`)

	exits := h.route(RouteConfig{Name: "exit"}, func(w http.ResponseWriter, r *http.Request) { runtime.Goexit() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, exits, "POST", "/exit", testKey, `{}`)
	}()
	<-done
	assertJSONError(t, send(t, exits, "POST", "/exit", testKey, `{}`), 409, `{"error":"idempotency_previous_failed"}`)
	if h.calls.Load() != 2 {
		t.Fatalf("calls = %d, want 2", h.calls.Load())
	}
}

// TestRecordFailureLeavesKeyInFlight: the client still gets the real
// response, the key is never executed again and later answers outcome
// unknown.
func TestRecordFailureLeavesKeyInFlight(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	ms := NewMemoryStore()
	ms.now = clock.Now
	reg := prometheus.NewRegistry()
	mw, err := New(recordFailStore{ms}, Config{Lease: 300 * time.Millisecond, StoreTimeout: 50 * time.Millisecond,
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		orderHandler(w, r)
	}))
	w := send(t, rt, "POST", "/orders", testKey, `{}`)
	if w.Code != 201 || !strings.HasPrefix(w.Body.String(), `{"id":1`) {
		t.Fatalf("client did not get the real response: %d %s", w.Code, w.Body)
	}
	if testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 1 {
		t.Fatal("record failure not counted")
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 409 || !strings.Contains(w.Body.String(), "idempotency_in_flight") {
		t.Fatalf("inside the lease: %d %s", w.Code, w.Body)
	}
	clock.Advance(time.Second)
	w = send(t, rt, "POST", "/orders", testKey, `{}`)
	assertJSONError(t, w, 409, `{"error":"idempotency_outcome_unknown"}`)
	if calls.Load() != 1 {
		t.Fatalf("calls = %d, want 1", calls.Load())
	}
}

// TestClaimTooSlowForTheHandler: a claim so slow that the handler's
// deadline (lease less store timeout) has passed when it returns does not
// run the handler with a dead context (which would fail the key for its
// whole TTL): the key is released and the client gets 503; its retry runs.
func TestClaimTooSlowForTheHandler(t *testing.T) {
	t.Parallel()
	s := &slowClaimStore{MemoryStore: NewMemoryStore(), delay: 150 * time.Millisecond}
	mw, err := New(s, Config{Lease: 300 * time.Millisecond, StoreTimeout: 200 * time.Millisecond,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		orderHandler(w, r)
	}))
	w := send(t, rt, "POST", "/orders", testKey, `{}`)
	assertJSONError(t, w, 503, `{"error":"idempotency_store_unavailable"}`)
	if w.Header().Get("Retry-After") != "1" || calls.Load() != 0 {
		t.Fatalf("Retry-After %q, handler ran %d times", w.Header().Get("Retry-After"), calls.Load())
	}
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 || calls.Load() != 1 {
		t.Fatalf("retry after the release: %d %s, %d executions", w.Code, w.Body, calls.Load())
	}
}

// TestClientHangsUp: the handler's context is detached from the client's
// connection, so an order finishes when its client goes away, and the
// retry replays it. The handler waits until the server has seen the
// hang-up (the request's own context is cancelled), then checks its own.
func TestClientHangsUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	started := make(chan struct{})
	hungUp := make(chan context.Context, 1) // the server-side request's context
	finished := make(chan error, 1)
	rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-(<-hungUp).Done():
		case <-time.After(10 * time.Second):
			finished <- errors.New("the server never noticed the client hang up")
			return
		}
		if err := r.Context().Err(); err != nil {
			finished <- fmt.Errorf("handler context ended with the client: %w", err)
			return
		}
		orderHandler(w, r)
		finished <- nil
	})
	served := make(chan struct{}) // the middleware has recorded and answered
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hungUp <- r.Context()
		rt.ServeHTTP(w, r)
		close(served)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set(HeaderKey, testKey)
	errc := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the client did not hang up")
	}
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
	<-served
	w := send(t, rt, "POST", "/", testKey, `{}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || h.calls.Load() != 1 {
		t.Fatalf("retry: %d replayed=%q calls=%d", w.Code, w.Header().Get(HeaderReplayed), h.calls.Load())
	}
}

// TestRecordedBeforeSent: the outcome is recorded, then the response is
// sent, so a client retrying right after its answer gets the replay (or
// its 409), never a 409 in flight. The store's outcome call checks that
// nothing has gone out yet, for every outcome.
func TestRecordedBeforeSent(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		rc     RouteConfig
		status int
		op     string
	}{
		"completed":          {status: 201, op: "complete"},
		"failed":             {status: 500, op: "fail"},
		"released (429)":     {status: 429, op: "release"},
		"released (NoStore)": {rc: RouteConfig{NoStore: true}, status: 201, op: "release"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spy := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
			var checked atomic.Int64
			check := func(context.Context, int) error {
				checked.Add(1)
				if spy.sent.Load() {
					t.Errorf("%s: the response was sent before the outcome was recorded", name)
				}
				return nil
			}
			s := &hookStore{MemoryStore: NewMemoryStore(), complete: check, fail: check, release: check}
			mw := newHooked(t, s, Config{})
			c.rc.Name = "orders"
			rt := mw.MustRoute(c.rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(`{"id":1}`))
			}))
			r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
			r.Header.Set(HeaderKey, testKey)
			rt.ServeHTTP(spy, r)
			if spy.Code != c.status || spy.Body.String() != `{"id":1}` {
				t.Fatalf("client got %d %s, want %d and the body", spy.Code, spy.Body, c.status)
			}
			ops := map[string]int64{"complete": s.completes.Load(), "fail": s.fails.Load(), "release": s.rels.Load()}
			if checked.Load() != 1 || ops[c.op] != 1 {
				t.Fatalf("outcome calls %v, want one %s", ops, c.op)
			}
		})
	}
}

// TestRecordRetried: a complete or a fail that the store refuses a few
// times is retried while the lease allows; the record lands and the retry
// gets its answer (the replay, or 409 previous failed), with no record
// failure counted.
func TestRecordRetried(t *testing.T) {
	t.Parallel()
	const failures = 2
	flaky := func(op string) func(context.Context, int) error {
		return func(_ context.Context, try int) error {
			if try <= failures {
				return &StoreError{Op: op, Reason: ReasonConnection, Err: errors.New("connection reset")}
			}
			return nil
		}
	}
	for _, c := range []struct {
		op     string
		status int
		want   string // of the retry
	}{
		{"complete", 201, ""},
		{"fail", 500, `{"error":"idempotency_previous_failed"}`},
	} {
		t.Run(c.op, func(t *testing.T) {
			t.Parallel()
			s := &hookStore{MemoryStore: NewMemoryStore(), complete: flaky("complete"), fail: flaky("fail")}
			mw := newHooked(t, s, Config{})
			var calls atomic.Int64
			rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(`{"id":1}`))
			}))
			if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != c.status {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			tries := map[string]int64{"complete": s.completes.Load(), "fail": s.fails.Load()}[c.op]
			if tries != failures+1 {
				t.Fatalf("%s tried %d times, want %d", c.op, tries, failures+1)
			}
			w := send(t, rt, "POST", "/orders", testKey, `{}`)
			if c.want == "" {
				if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != `{"idempotency_replayed":true,"id":1}` {
					t.Fatalf("retry: %d %s, want the replay", w.Code, w.Body)
				}
			} else {
				assertJSONError(t, w, 409, c.want)
			}
			if calls.Load() != 1 || testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 0 ||
				testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues(c.op, ReasonConnection)) != failures {
				t.Fatalf("calls %d, record failures %v, store errors %v", calls.Load(),
					testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")),
					testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues(c.op, ReasonConnection)))
			}
		})
	}

	// A record that landed although its reply was lost: the retry finds the
	// key no longer owned in flight, which means done, not taken over.
	t.Run("reply lost", func(t *testing.T) {
		t.Parallel()
		var s *hookStore
		s = &hookStore{MemoryStore: NewMemoryStore(), complete: func(ctx context.Context, try int) error {
			if try == 1 {
				rows, _ := s.MemoryStore.ExportScope(ctx, "")
				if err := s.MemoryStore.Complete(ctx, rows[0].Fence(), rows[0], Response{Status: 201, BodyKind: BodyRaw, Body: []byte("ok")}); err != nil {
					return err
				}
				return &StoreError{Op: "complete", Reason: ReasonConnection, Err: errors.New("reply lost")}
			}
			return nil
		}}
		mw := newHooked(t, s, Config{})
		rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			_, _ = w.Write([]byte("ok"))
		}))
		send(t, rt, "POST", "/orders", testKey, `{}`)
		if s.completes.Load() != 2 || testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 0 {
			t.Fatalf("completes %d, record failures %v; want 2 and 0", s.completes.Load(),
				testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")))
		}
		if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != "ok" {
			t.Fatalf("retry: %d %s, want the replay", w.Code, w.Body)
		}
	})
}

// TestHandlerDeadlineValue: the handler's deadline is the lease less the
// store timeout, counted from the claim (not from its answer, which a slow
// store delays).
func TestHandlerDeadlineValue(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout, claimTakes = 10 * time.Second, 3 * time.Second, 50 * time.Millisecond
	var claimEntered time.Time
	s := &hookStore{MemoryStore: NewMemoryStore(), claim: func(context.Context, ClaimRequest) error {
		claimEntered = time.Now()
		time.Sleep(claimTakes) // a slow reply, not synchronisation
		return nil
	}}
	mw := newHooked(t, s, Config{Lease: lease, StoreTimeout: storeTimeout})
	var deadline time.Time
	var ok bool
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline, ok = r.Context().Deadline()
	}))
	before := time.Now()
	send(t, rt, "POST", "/orders", testKey, `{}`)
	// The claim began between before and claimEntered.
	lo, hi := before.Add(lease-storeTimeout), claimEntered.Add(lease-storeTimeout)
	if !ok || deadline.Before(lo) || deadline.After(hi) {
		t.Fatalf("handler deadline %v after the request began (ok %v), want between %v and %v",
			deadline.Sub(before), ok, lo.Sub(before), hi.Sub(before))
	}
}

// TestNoStoreConcurrentRetries: on a NoStore route a duplicate that arrives
// while the handler runs gets 409 in flight; once it has finished, the key
// is released and a retry executes again (no body was kept to replay).
func TestNoStoreConcurrentRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	started, release := make(chan struct{}, 1), make(chan struct{})
	rt := h.route(RouteConfig{Name: "profile", NoStore: true}, func(w http.ResponseWriter, r *http.Request) {
		if h.calls.Load() == 1 {
			started <- struct{}{}
			<-release
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte("personal data"))
	})
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- send(t, rt, "POST", "/profile", testKey, `{}`) }()
	<-started
	for range 2 {
		w := send(t, rt, "POST", "/profile", testKey, `{}`)
		assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	}
	close(release)
	if w := <-first; w.Code != 201 || w.Body.String() != "personal data" {
		t.Fatalf("owner: %d %s", w.Code, w.Body)
	}
	w := send(t, rt, "POST", "/profile", testKey, `{}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" || h.calls.Load() != 2 {
		t.Fatalf("retry after completion: %d replayed=%q, calls %d; want a second execution", w.Code, w.Header().Get(HeaderReplayed), h.calls.Load())
	}
	if rows, _ := h.store.ExportScope(context.Background(), ""); len(rows) != 0 {
		t.Fatalf("a NoStore route left rows: %+v", rows)
	}
}

// TestSettleBacksOff: a failing store is retried after a growing pause
// (25 ms, then 50 ms, ...), never in a tight loop. Sleeps never end early,
// so the gaps are lower bounds that hold on any machine.
func TestSettleBacksOff(t *testing.T) {
	t.Parallel()
	var calls []time.Time
	s := &hookStore{MemoryStore: NewMemoryStore(), complete: func(ctx context.Context, try int) error {
		calls = append(calls, time.Now())
		if try <= 3 {
			return &StoreError{Op: "complete", Reason: ReasonConnection, Err: errors.New("connection reset")}
		}
		return nil
	}}
	mw := newHooked(t, s, Config{})
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
	}))
	if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 {
		t.Fatalf("got %d, want 201", w.Code)
	}
	if len(calls) != 4 {
		t.Fatalf("Complete called %d times, want 4 (three failures, then success)", len(calls))
	}
	for i, want := range []time.Duration{25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
		if gap := calls[i+1].Sub(calls[i]); gap < want {
			t.Errorf("retry %d came %v after the failure, want at least %v", i+1, gap, want)
		}
	}
}
