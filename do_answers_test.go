package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// TestDoDuplicateErrors: each answer that does not run the function is an
// *ErrorAnswer matched with errors.Is.
func TestDoDuplicateErrors(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		op := newOp(t, store, idempotency.Config{}, idempotency.RouteConfig{MaxResponseBytes: 32})
		noRun := func(context.Context) (receipt, error) {
			t.Error("the function ran for a call that must not run it")
			return receipt{}, nil
		}
		t.Run("InFlight", func(t *testing.T) {
			key := uuid.NewString()
			running, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, _, err := idempotency.Do(context.Background(), op, payment(key), func(context.Context) (receipt, error) {
					close(running)
					<-release
					return receipt{Ledger: 1}, nil
				})
				done <- err
			}()
			<-running
			_, _, err := idempotency.Do(t.Context(), op, payment(key), noRun)
			close(release)
			if ea := wantAnswer(t, "while the first call runs", err, idempotency.ErrInFlight, 409); ea.RetryAfterMS != 5000 {
				t.Fatalf("in flight: RetryAfterMS %d, want 5000", ea.RetryAfterMS)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
		t.Run("Mismatch", func(t *testing.T) {
			key := uuid.NewString()
			if _, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return receipt{}, nil }); err != nil {
				t.Fatal(err)
			}
			other := payment(key)
			other.Request = []byte(`{"amount": 999, "currency": "EUR"}`)
			_, _, err := idempotency.Do(t.Context(), op, other, noRun)
			wantAnswer(t, "same key, other request", err, idempotency.ErrMismatch, 422)
			// The same JSON value written otherwise is the same request.
			same := payment(key)
			same.Request = []byte(`{"currency":"EUR","amount":100}`)
			if _, info, err := idempotency.Do(t.Context(), op, same, noRun); err != nil || !info.Replayed {
				t.Fatalf("same JSON, other bytes: %+v %v; want the replay", info, err)
			}
		})
		t.Run("ResponseNotStored", func(t *testing.T) {
			key := uuid.NewString()
			big := receipt{Ledger: 1, Extra: "more than thirty-two bytes of JSON"}
			if v, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return big, nil }); err != nil || v.Ledger != 1 {
				t.Fatalf("first: %+v %v; want the value", v, err)
			}
			_, _, err := idempotency.Do(t.Context(), op, payment(key), noRun)
			if ea := wantAnswer(t, "after a result over the limit", err, idempotency.ErrResponseNotStored, 409); ea.OriginalStatus != 200 {
				t.Fatalf("OriginalStatus %d, want 200", ea.OriginalStatus)
			}
		})
		t.Run("InvalidKey", func(t *testing.T) {
			for _, key := range []string{"", "tab\tkey", "ü", string(make([]byte, 256))} {
				c := payment(key)
				_, _, err := idempotency.Do(t.Context(), op, c, noRun)
				wantAnswer(t, fmt.Sprintf("key %q", key), err, idempotency.ErrInvalidKey, 400)
			}
		})
		t.Run("InvalidScope", func(t *testing.T) {
			c := payment(uuid.NewString())
			c.Scope = "user-\xff"
			_, _, err := idempotency.Do(t.Context(), op, c, noRun)
			wantAnswer(t, "a scope the store cannot hold", err, idempotency.ErrInvalidScope, 400)
		})
	})
}

// TestDoOutcomeUnknown: a first run whose outcome could not be recorded
// leaves the key in flight; once its lease is over, a retry gets
// ErrOutcomeUnknown, never a second run.
func TestDoOutcomeUnknown(t *testing.T) {
	t.Parallel()
	clock := idempotency.NewFakeClockForTest()
	store := completeFails{idempotency.NewMemoryStoreForTest(clock.Now)}
	op := newOp(t, store, idempotency.Config{Lease: 300 * time.Millisecond, StoreTimeout: 100 * time.Millisecond}, idempotency.RouteConfig{})
	key := uuid.NewString()
	v, _, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return receipt{Ledger: 1}, nil })
	if err != nil || v.Ledger != 1 {
		t.Fatalf("first: %+v %v; want the value although it was not recorded", v, err)
	}
	clock.Advance(time.Second)
	_, _, err = idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
		t.Error("a key of unknown outcome ran again")
		return receipt{}, nil
	})
	wantAnswer(t, "past the lease", err, idempotency.ErrOutcomeUnknown, 409)
}

// completeFails is a memory store that cannot record a completion.
type completeFails struct{ *idempotency.MemoryStore }

func (completeFails) Complete(context.Context, idempotency.Fence, idempotency.Record, idempotency.Response) error {
	return &idempotency.StoreError{Op: "complete", Reason: idempotency.ReasonConnection, Err: errors.New("connection reset")}
}

// TestDoKillSwitch: the kill-switch is for endpoints. With it off, an
// Operation keeps deduplicating (a consumer's redelivery is replayed, not
// charged again), unless it sets FollowKillSwitch: then Do runs its
// function every time without a store call, says it bypassed, stores
// nothing, and counts idempotency_bypasses_total{reason="disabled"}.
func TestDoKillSwitch(t *testing.T) {
	t.Parallel()
	for _, follow := range []bool{false, true} {
		t.Run(fmt.Sprintf("FollowKillSwitch=%v", follow), func(t *testing.T) {
			t.Parallel()
			var on atomic.Bool
			store := &claimCounter{MemoryStore: idempotency.NewMemoryStore()}
			reg := prometheus.NewRegistry()
			mw, err := idempotency.New(store, idempotency.Config{Registerer: reg, Logger: quiet,
				Enabled: func(context.Context) bool { return on.Load() }})
			if err != nil {
				t.Fatal(err)
			}
			op, err := mw.Operation("settle-payment", idempotency.RouteConfig{Scoped: true, FollowKillSwitch: follow})
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			key := uuid.NewString()
			infos := make([]idempotency.CallInfo, 2)
			for i := range infos {
				v, info, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return receipt{Ledger: runs.Add(1)}, nil })
				if err != nil || v.Ledger != 1 && !follow {
					t.Fatalf("kill-switch off, call %d: %+v %+v %v", i+1, v, info, err)
				}
				infos[i] = info
			}
			bypassed := gathered(t, reg, "idempotency_bypasses_total", "do:settle-payment", "disabled")
			recs, err := store.ExportScope(t.Context(), "user-7")
			if err != nil {
				t.Fatal(err)
			}
			if follow {
				if runs.Load() != 2 || !infos[0].Bypassed || !infos[1].Bypassed || store.claims.Load() != 0 || len(recs) != 0 || bypassed != 2 {
					t.Fatalf("following the switch: %d runs, %+v, %d claims, %d rows, %v bypasses counted; want 2 runs bypassed, no store call",
						runs.Load(), infos, store.claims.Load(), len(recs), bypassed)
				}
			} else if runs.Load() != 1 || infos[0].Bypassed || !infos[1].Replayed || len(recs) != 1 || bypassed != 0 {
				t.Fatalf("not following the switch: %d runs, %+v, %d rows, %v bypasses; want one run and its replay", runs.Load(), infos, len(recs), bypassed)
			}
			on.Store(true)
			if _, info, err := idempotency.Do(t.Context(), op, payment(uuid.NewString()), func(context.Context) (receipt, error) { return receipt{}, nil }); err != nil || info.Bypassed {
				t.Fatalf("kill-switch on: %+v %v", info, err)
			}
		})
	}
}

// TestDoReplayHook: a replay is audited with the call; a hook error
// refuses it on a fail-closed Operation and not on a fail-open one.
func TestDoReplayHook(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprint("FailOpen=", failOpen), func(t *testing.T) {
			t.Parallel()
			var events []idempotency.ReplayEvent
			hookErr := errors.New("audit table gone")
			var fail atomic.Bool
			op := newOp(t, idempotency.NewMemoryStore(), idempotency.Config{OnReplay: func(ctx context.Context, ev idempotency.ReplayEvent) error {
				if _, ok := idempotency.RequestFromContext(ctx); ok {
					t.Error("a Do replay's hook context carries an HTTP request")
				}
				events = append(events, ev)
				if fail.Load() {
					return hookErr
				}
				return nil
			}}, idempotency.RouteConfig{FailOpen: failOpen})
			key := uuid.NewString()
			fn := func(context.Context) (receipt, error) { return receipt{Ledger: 1}, nil }
			if _, _, err := idempotency.Do(t.Context(), op, payment(key), fn); err != nil {
				t.Fatal(err)
			}
			if _, info, err := idempotency.Do(t.Context(), op, payment(key), fn); err != nil || !info.Replayed {
				t.Fatalf("replay: %+v %v", info, err)
			}
			ev := events[0]
			if len(events) != 1 || ev.Key != key || ev.Scope != "user-7" || ev.Endpoint != "do:settle-payment" || ev.Adapter != "do" || ev.OriginalStatus != 200 {
				t.Fatalf("replay events %+v", events)
			}
			fail.Store(true)
			_, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
			if failOpen {
				if err != nil || !info.Replayed {
					t.Fatalf("fail-open with a failing hook: %+v %v; want the replay", info, err)
				}
				return
			}
			wantAnswer(t, "fail-closed with a failing hook", err, idempotency.ErrStoreUnavailable, 503)
			if !errors.Is(err, hookErr) {
				t.Fatalf("%v does not carry the hook's error", err)
			}
		})
	}
}
