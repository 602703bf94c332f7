package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// expiresOf is what Idempotency-Expires must say for a row claimed at
// claimed under the default TTL: its expires_at rounded down, never up.
func expiresOf(claimed time.Time) string {
	return claimed.Add(DefaultTTL).UTC().Truncate(time.Second).Format(http.TimeFormat)
}

// TestExpiresHeaderRoundsDown: the header is the row's expires_at rounded
// down to the second (750 ms past a second still names that second) on
// the original, its replay and an answer about its row, in both error
// formats; the handler cannot set it, and a route cannot replay it.
func TestExpiresHeaderRoundsDown(t *testing.T) {
	t.Parallel()
	for _, format := range []ErrorFormat{ErrorJSON, ErrorProblem} {
		h := newHarness(t, Config{ErrorFormat: format})
		h.clock.Advance(750 * time.Millisecond)
		want := expiresOf(h.clock.Now())
		rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(HeaderExpires, "the handler's")
			orderHandler(w, r)
		})
		for _, c := range []struct {
			what, body string
			status     int
		}{{"original", `{"a":1}`, 201}, {"replay", `{"a":1}`, 201}, {"mismatch", `{"a":2}`, 422}} {
			w := send(t, rt, "POST", "/orders", testKey, c.body)
			if w.Code != c.status || w.Header().Values(HeaderExpires)[0] != want || len(w.Header().Values(HeaderExpires)) != 1 {
				t.Fatalf("format %d, %s: status %d, Idempotency-Expires %q, want %d and %q", format, c.what, w.Code, w.Header().Values(HeaderExpires), c.status, want)
			}
		}
	}
	h := newHarness(t, Config{})
	if _, err := h.mw.Route(RouteConfig{ReplayHeaders: []string{"idempotency-expires"}}); err == nil {
		t.Fatal("a route may replay Idempotency-Expires, which names the row of each answer")
	}
}

// TestExpiresHeaderAbsentWithoutARow: answers that read no row carry no
// Idempotency-Expires: 503 (the store down), a contention 409 (a claim
// that lost every round, or failed as contention), and a 429 whose key
// was given back, whose row is gone.
func TestExpiresHeaderAbsentWithoutARow(t *testing.T) {
	t.Parallel()
	check := func(what string, w interface {
		Header() http.Header
	}, code, wantCode int) {
		t.Helper()
		if code != wantCode || w.Header().Get(HeaderExpires) != "" {
			t.Errorf("%s: status %d (want %d), Idempotency-Expires %q (want none)", what, code, wantCode, w.Header().Get(HeaderExpires))
		}
	}
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
	h.store.fail.Store(&e)
	w := send(t, rt, "POST", "/orders", testKey, `{}`)
	check("503", w, w.Code, 503)

	for _, expired := range []bool{false, true} {
		_, rt, _ := countedRoute(t, &contentionStore{MemoryStore: NewMemoryStore(), expired: expired}, RouteConfig{Name: "orders"})
		w := send(t, rt, "POST", "/orders", testKey, `{}`)
		check("contention 409", w, w.Code, 409)
	}

	h = newHarness(t, Config{})
	rt = h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(statusTooManyRequests) })
	w = send(t, rt, "POST", "/orders", testKey, `{}`)
	check("429 released", w, w.Code, statusTooManyRequests)
}

// TestErrorWriterGetsExpires: a custom ErrorWriter is told the expiry of
// an answer about a row (ErrorAnswer.Expires), and the header is set
// before it writes; an answer without a row tells none.
func TestErrorWriterGetsExpires(t *testing.T) {
	t.Parallel()
	var got []ErrorAnswer
	h := newHarness(t, Config{ErrorWriter: func(w http.ResponseWriter, _ *http.Request, e ErrorAnswer) {
		got = append(got, e)
		if w.Header().Get(HeaderExpires) != e.Expires.Format(http.TimeFormat) && !e.Expires.IsZero() {
			t.Errorf("the header %q is not ErrorAnswer.Expires %v", w.Header().Get(HeaderExpires), e.Expires)
		}
		w.WriteHeader(e.Status)
	}})
	h.clock.Advance(250 * time.Millisecond)
	want := h.clock.Now().Add(DefaultTTL).Truncate(time.Second)
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
	send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
	send(t, rt, "POST", "/orders", "bad", `{"a":2}`)
	if len(got) != 2 || !got[0].Expires.Equal(want) || got[0].Expires.Location() != time.UTC || !got[1].Expires.IsZero() {
		t.Fatalf("ErrorWriter got %+v, want the 422 with Expires %v, then the 400 without", got, want)
	}
}

// TestDoReportsExpires: Do's CallInfo.Expires is the row's expires_at,
// rounded down, on the first run, its replay and an answer about the row
// (where ErrorAnswer.Expires says it too); zero with no row (a bad key,
// the kill-switch off).
func TestDoReportsExpires(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 7, 10, 12, 0, 0, 999e6, time.UTC)}
	store := NewMemoryStore()
	store.now = clock.Now
	var enabled atomic.Bool
	enabled.Store(true)
	mw := newHooked(t, store, Config{Enabled: func(context.Context) bool { return enabled.Load() }})
	want := clock.Now().Add(DefaultTTL).Truncate(time.Second)
	op, err := mw.Operation("settle", RouteConfig{Scoped: true, FollowKillSwitch: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := Call{Key: "order-1", Scope: "u1", Request: []byte(`{"a":1}`)}
	fn := func(context.Context) (int, error) { return 7, nil }
	for _, what := range []string{"first run", "replay"} {
		_, info, err := Do(ctx, op, call, fn)
		if err != nil || !info.Expires.Equal(want) {
			t.Fatalf("%s: err %v, Expires %v, want %v", what, err, info.Expires, want)
		}
	}
	call.Request = []byte(`{"a":2}`)
	_, info, err := Do(ctx, op, call, fn)
	var ea *ErrorAnswer
	if !errors.As(err, &ea) || !errors.Is(err, ErrMismatch) || !ea.Expires.Equal(want) || !info.Expires.Equal(want) {
		t.Fatalf("mismatch: %v, ErrorAnswer.Expires %v, CallInfo.Expires %v, want %v", err, ea, info.Expires, want)
	}
	if _, info, err = Do(ctx, op, Call{Key: "", Scope: "u1"}, fn); err == nil || !info.Expires.IsZero() {
		t.Fatalf("no key: %v, Expires %v, want zero", err, info.Expires)
	}
	enabled.Store(false)
	if _, info, err = Do(ctx, op, Call{Key: "order-2", Scope: "u1"}, fn); err != nil || !info.Bypassed || !info.Expires.IsZero() {
		t.Fatalf("kill-switch off: %v, %+v, want a bypass without Expires", err, info)
	}
}
