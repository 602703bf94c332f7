package idempotency

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
)

// waitStormKeys and waitStormCopies are the storm's shape (issue #36): 32
// copies of each key at once.
const (
	waitStormKeys   = 4
	waitStormCopies = 32
)

// waitNeverHangs bounds an answer that must come without waiting the wait
// out: far beyond any poll or store call of these tests.
const waitNeverHangs = 10 * time.Second

func TestWaitInFlightRefusedWhereItCannotApply(t *testing.T) {
	t.Parallel()
	mw := newHooked(t, NewMemoryStore(), Config{Lease: 10 * time.Second})
	for _, tc := range []struct {
		name string
		rc   RouteConfig
		want string
	}{
		{"negative", RouteConfig{WaitInFlight: -time.Second}, "must not be negative"},
		{"the lease", RouteConfig{WaitInFlight: 10 * time.Second}, "must be below Config.Lease"},
		{"past the lease", RouteConfig{WaitInFlight: time.Minute}, "must be below Config.Lease"},
		{"transactional", RouteConfig{WaitInFlight: time.Second, Transactional: true}, "does not apply to Transactional"},
		{"no store", RouteConfig{WaitInFlight: time.Second, NoStore: true}, "NoStore"},
	} {
		if _, err := mw.Route(tc.rc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Route = %v, want an error saying %q", tc.name, err, tc.want)
		}
		tc.rc.MinKeyLength = 16
		if _, err := mw.Operation("op", tc.rc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Operation = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := mw.Route(RouteConfig{WaitInFlight: 9 * time.Second}); err != nil {
		t.Errorf("a wait below the lease: %v", err)
	}
}

// stormAnswers counts a storm's answers.
type stormAnswers struct {
	fresh, replays, inFlight, other atomic.Int64
}

// waitStorm sends waitStormCopies copies of waitStormKeys keys at once
// through h and counts the answers; executed counts the handler's runs.
func waitStorm(t *testing.T, h http.Handler) *stormAnswers {
	t.Helper()
	var a stormAnswers
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range waitStormKeys {
		key := "00000000-0000-4000-8000-00000000000" + string(rune('1'+k))
		for range waitStormCopies {
			wg.Go(func() {
				<-start
				w := send(t, h, "POST", "/orders", key, `{"qty":1}`)
				switch {
				case w.Code == http.StatusCreated && w.Header().Get(HeaderReplayed) == "true":
					a.replays.Add(1)
				case w.Code == http.StatusCreated:
					a.fresh.Add(1)
				case w.Code == http.StatusConflict && strings.Contains(w.Body.String(), "idempotency_in_flight"):
					a.inFlight.Add(1)
				default:
					a.other.Add(1)
					t.Errorf("key %s: %d %s", key, w.Code, w.Body)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	return &a
}

func TestWaitInFlightStormMemory(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	route := h.route(RouteConfig{Name: "orders", WaitInFlight: time.Second}, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond) // the handler's work, not a synchronisation
		orderHandler(w, r)
	})
	a := waitStorm(t, route)
	t.Logf("storm: %d executions, %d fresh, %d replays, %d in flight", h.calls.Load(), a.fresh.Load(), a.replays.Load(), a.inFlight.Load())
	if h.calls.Load() != waitStormKeys || a.fresh.Load() != waitStormKeys {
		t.Errorf("%d executions, %d fresh answers; want one per key (%d)", h.calls.Load(), a.fresh.Load(), waitStormKeys)
	}
	if a.replays.Load() != waitStormKeys*(waitStormCopies-1) || a.inFlight.Load() != 0 {
		t.Errorf("%d replays and %d in flight; want every duplicate (%d) replayed", a.replays.Load(), a.inFlight.Load(), waitStormKeys*(waitStormCopies-1))
	}
}

// blockedOwner starts the owner of key through h, its handler held until
// the returned release is called, and returns once the handler runs.
func blockedOwner(t *testing.T, h http.Handler, key string, answer int) (release func(), done <-chan *httptest.ResponseRecorder) {
	t.Helper()
	entered, hold := make(chan struct{}), make(chan struct{})
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`))
		r.Header.Set(HeaderKey, key)
		r = r.WithContext(context.WithValue(r.Context(), ownerCtxKey{}, &ownerGate{entered, hold, answer}))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		out <- w
	}()
	select {
	case <-entered:
	case <-time.After(waitNeverHangs):
		t.Fatal("the owner's handler never ran")
	}
	var once sync.Once
	return func() { once.Do(func() { close(hold) }) }, out
}

// ownerCtxKey carries an ownerGate to gatedHandler.
type ownerCtxKey struct{}

// ownerGate holds the owner's handler: it says it entered, waits for
// hold, and answers status.
type ownerGate struct {
	entered, hold chan struct{}
	status        int
}

// gatedHandler is orderHandler, held by the request's ownerGate if it has
// one.
func gatedHandler(w http.ResponseWriter, r *http.Request) {
	if g, ok := r.Context().Value(ownerCtxKey{}).(*ownerGate); ok {
		close(g.entered)
		<-g.hold
		if g.status != http.StatusCreated {
			w.WriteHeader(g.status)
			return
		}
	}
	orderHandler(w, r)
}

// awaitWaiters returns once n duplicates wait on the store's wake-ups.
func awaitWaiters(t *testing.T, count func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(waitNeverHangs)
	for count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters registered, want %d", count(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// duplicates sends n copies of key through h at once and returns their
// answers once all came.
func duplicates(t *testing.T, h http.Handler, key string, n int) <-chan []*httptest.ResponseRecorder {
	out := make(chan []*httptest.ResponseRecorder, 1)
	go func() {
		ws := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		for i := range ws {
			wg.Go(func() { ws[i] = send(t, h, "POST", "/orders", key, `{"qty":1}`) })
		}
		wg.Wait()
		out <- ws
	}()
	return out
}

func TestWaitInFlightAnswersTheOwnersOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		want   func(t *testing.T, w *httptest.ResponseRecorder)
	}{
		{"completes", http.StatusCreated, func(t *testing.T, w *httptest.ResponseRecorder) {
			if w.Code != http.StatusCreated || w.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("duplicate: %d replayed=%q, want the replayed 201", w.Code, w.Header().Get(HeaderReplayed))
			}
		}},
		{"fails", http.StatusBadGateway, func(t *testing.T, w *httptest.ResponseRecorder) {
			assertJSONError(t, w, http.StatusConflict, `{"error":"idempotency_previous_failed"}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			route := h.route(RouteConfig{Name: "orders", WaitInFlight: 20 * time.Second}, gatedHandler)
			const key = "00000000-0000-4000-8000-000000000001"
			release, owner := blockedOwner(t, route, key, tc.status)
			defer release()
			dups := duplicates(t, route, key, 8)
			awaitWaiters(t, h.store.wakes.count, 8)
			release()
			if w := <-owner; w.Code != tc.status {
				t.Fatalf("owner: %d, want %d", w.Code, tc.status)
			}
			select {
			case ws := <-dups:
				for _, w := range ws {
					tc.want(t, w)
				}
			case <-time.After(waitNeverHangs):
				t.Fatal("the waiting duplicates were not answered")
			}
			if n := h.calls.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
		})
	}
}

func TestWaitInFlightOwnerSlowerThanTheWait(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	const wait = 150 * time.Millisecond
	route := h.route(RouteConfig{Name: "orders", WaitInFlight: wait}, gatedHandler)
	const key = "00000000-0000-4000-8000-000000000001"
	release, owner := blockedOwner(t, route, key, http.StatusCreated)
	start := time.Now()
	w := send(t, route, "POST", "/orders", key, `{"qty":1}`)
	took := time.Since(start)
	release()
	<-owner
	assertJSONError(t, w, http.StatusConflict, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	if took < wait {
		t.Errorf("answered in flight after %v, before the wait (%v) ran out", took, wait)
	}
	if took > waitNeverHangs {
		t.Errorf("answered after %v", took)
	}
}

func TestWaitInFlightMismatchAnswersAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	route := h.route(RouteConfig{Name: "orders", WaitInFlight: 20 * time.Second}, gatedHandler)
	const key = "00000000-0000-4000-8000-000000000001"
	release, owner := blockedOwner(t, route, key, http.StatusCreated)
	defer func() { release(); <-owner }()
	start := time.Now()
	w := send(t, route, "POST", "/orders", key, `{"qty":2}`)
	assertJSONError(t, w, http.StatusUnprocessableEntity, `{"error":"idempotency_key_body_mismatch"}`)
	if took := time.Since(start); took > waitNeverHangs {
		t.Errorf("the mismatch waited %v", took)
	}
}

func TestWaitInFlightEndsWithTheCallersContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	route := h.route(RouteConfig{Name: "orders", WaitInFlight: 20 * time.Second}, gatedHandler)
	const key = "00000000-0000-4000-8000-000000000001"
	release, owner := blockedOwner(t, route, key, http.StatusCreated)
	defer func() { release(); <-owner }()
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`)).WithContext(ctx)
	r.Header.Set(HeaderKey, key)
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { route.ServeHTTP(w, r); close(done) }()
	awaitWaiters(t, h.store.wakes.count, 1)
	cancel()
	select {
	case <-done:
	case <-time.After(waitNeverHangs):
		t.Fatal("the wait outlived the caller's context")
	}
	if w.Code != http.StatusConflict {
		t.Errorf("status %d, want 409 in flight", w.Code)
	}
}

// pollingStore is a MemoryStore that never wakes a waiter, as sqlstore: a
// waiting duplicate learns of the outcome by polling alone. It counts the
// claims (and re-reads) it answered.
type pollingStore struct {
	*MemoryStore
	claims atomic.Int64
}

func (*pollingStore) Watch(int64) (<-chan struct{}, func()) { return nil, func() {} }

func (s *pollingStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	defer s.claims.Add(1)
	return s.MemoryStore.Claim(ctx, req)
}

func TestWaitInFlightUnwokenCostsAtMostAPoll(t *testing.T) {
	t.Parallel()
	s := &pollingStore{MemoryStore: NewMemoryStore()}
	mw := newHooked(t, s, Config{})
	var calls atomic.Int64
	route := mw.MustRoute(RouteConfig{Name: "orders", WaitInFlight: 20 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		gatedHandler(w, r)
	}))
	const key = "00000000-0000-4000-8000-000000000001"
	release, owner := blockedOwner(t, route, key, http.StatusCreated)
	dups := duplicates(t, route, key, 4)
	// The owner's claim, each duplicate's, and its first re-read: all wait.
	awaitWaiters(t, func() int { return int(s.claims.Load()) }, 1+2*4)
	release()
	<-owner
	answered := time.Now()
	ws := <-dups
	// A generous bound for one poll (waitPoll): far below the 20 s wait.
	if took := time.Since(answered); took > 20*waitPoll {
		t.Errorf("the duplicates were answered %v after the outcome, want within about one poll (%v)", took, waitPoll)
	}
	for _, w := range ws {
		if w.Code != http.StatusCreated || w.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("duplicate: %d %s, want the replay", w.Code, w.Body)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("%d executions, want 1", calls.Load())
	}
}

func TestWaitInFlightStoreErrorAnswersInFlightOnFailOpen(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	s := &hookStore{MemoryStore: NewMemoryStore()}
	s.claim = func(ctx context.Context, _ ClaimRequest) error {
		if failing.Load() {
			return &StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection cut")}
		}
		return nil
	}
	mw := newHooked(t, unreachable{s}, Config{})
	var calls atomic.Int64
	route := mw.MustRoute(RouteConfig{Name: "orders", FailOpen: true, WaitInFlight: 20 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		gatedHandler(w, r)
	}))
	const key = "00000000-0000-4000-8000-000000000001"
	release, owner := blockedOwner(t, route, key, http.StatusCreated)
	defer func() { release(); <-owner }()
	dups := duplicates(t, route, key, 4)
	awaitWaiters(t, s.wakes.count, 4)
	failing.Store(true)
	s.wakes.wakeAll() // the next re-read fails at once
	select {
	case ws := <-dups:
		for _, w := range ws {
			assertJSONError(t, w, http.StatusConflict, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
		}
	case <-time.After(waitNeverHangs):
		t.Fatal("the waiting duplicates were not answered")
	}
	if calls.Load() != 1 {
		t.Errorf("%d executions, want 1: a store error while waiting must never bypass", calls.Load())
	}
}

// unreachable is a store whose outage probe fails: a fail-open claim that
// fails with a connection error would bypass.
type unreachable struct{ *hookStore }

func (unreachable) Probe(context.Context) error {
	return &StoreError{Op: "probe", Reason: ReasonConnection, Err: errors.New("refused")}
}

func TestWaitInFlightDo(t *testing.T) {
	t.Parallel()
	mw := newHooked(t, NewMemoryStore(), Config{})
	op, err := mw.Operation("settle", RouteConfig{MinKeyLength: 16, WaitInFlight: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	var wg sync.WaitGroup
	var inFlight, replays atomic.Int64
	for range waitStormCopies {
		wg.Go(func() {
			v, _, err := Do(context.Background(), op, Call{Key: "settlement-0000000001", Request: []byte("1")}, func(ctx context.Context) (int, error) {
				runs.Add(1)
				time.Sleep(200 * time.Millisecond) // the function's work
				return 42, nil
			})
			switch {
			case errors.Is(err, ErrInFlight):
				inFlight.Add(1)
			case err != nil || v != 42:
				t.Errorf("Do = %v, %v", v, err)
			default:
				replays.Add(1)
			}
		})
	}
	wg.Wait()
	if runs.Load() != 1 || inFlight.Load() != 0 || replays.Load() != waitStormCopies {
		t.Errorf("%d runs, %d in flight, %d answered with 42; want 1, 0, %d", runs.Load(), inFlight.Load(), replays.Load(), waitStormCopies)
	}
}
