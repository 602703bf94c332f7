package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// TestJudge runs Do on the memory store for each answer the consumer can
// get and checks what it does with the delivery: ack a result, a decline
// or a replay; nack in flight, the store unavailable and a released key
// with a delay; dead-letter everything else.
func TestJudge(t *testing.T) {
	t.Parallel()
	np := nakPolicy{max: time.Second}
	newOp := func(t *testing.T, s idempotency.Store, cfg idempotency.Config, rc idempotency.RouteConfig) *idempotency.Operation {
		t.Helper()
		cfg.Logger = slog.New(slog.DiscardHandler)
		mw, err := idempotency.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		op, err := mw.Operation("settle-payment", rc)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	op := newOp(t, idempotency.NewMemoryStore(), idempotency.Config{}, idempotency.RouteConfig{})
	call := func(op *idempotency.Operation, key, scope, body string, fn func(context.Context) (receipt, error)) verdict {
		released := false
		_, info, err := idempotency.Do(t.Context(), op, idempotency.Call{Key: key, Scope: scope, Request: []byte(body)},
			func(ctx context.Context) (receipt, error) {
				r, err := fn(ctx)
				released = err != nil && strings.HasPrefix(err.Error(), "transient")
				return r, err
			})
		return np.judge(info, err, released, 1)
	}
	ok := func(context.Context) (receipt, error) { return receipt{LedgerID: 1}, nil }
	want := func(t *testing.T, step string, v verdict, act action, answer string) {
		t.Helper()
		if v.act != act || v.answer != answer {
			t.Errorf("%s: %v %q (%v); want %v %q", step, v.act, v.answer, v.err, act, answer)
		}
	}
	want(t, "first run", call(op, "pay-1", "user-1", `{"a":1}`, ok), ack, "settled")
	want(t, "redelivery", call(op, "pay-1", "user-1", `{"a":1}`, ok), ack, "replayed")
	want(t, "the id on another body", call(op, "pay-1", "user-1", `{"a":2}`, ok), deadLetter, "mismatch")
	want(t, "no key", call(op, "", "user-1", `{}`, ok), deadLetter, "invalid_key")
	want(t, "a key over 255 bytes", call(op, strings.Repeat("k", 256), "user-1", `{}`, ok), deadLetter, "invalid_key")
	want(t, "a scope with a NUL byte", call(op, "pay-2", "user\x00", `{}`, ok), deadLetter, "invalid_scope")

	declined := func(context.Context) (receipt, error) {
		return receipt{}, &idempotency.PermanentError{Code: "invalid_amount", Message: "no"}
	}
	want(t, "declined", call(op, "pay-3", "user-1", `{}`, declined), ack, "declined")
	want(t, "declined, redelivered", call(op, "pay-3", "user-1", `{}`, ok), ack, "declined")

	failing := func(context.Context) (receipt, error) { return receipt{}, errors.New("ledger: check violation") }
	want(t, "the function fails", call(op, "pay-4", "user-1", `{}`, failing), deadLetter, "failed")
	want(t, "after a failure", call(op, "pay-4", "user-1", `{}`, ok), deadLetter, "previous_failed")

	transient := func(context.Context) (receipt, error) {
		return receipt{}, idempotency.Retryable(errors.New("transient: connection reset"))
	}
	v := call(op, "pay-5", "user-1", `{}`, transient)
	want(t, "a retryable failure", v, nak, "released")
	if v.delay != storeBackoff {
		t.Errorf("released: delay %v, want %v", v.delay, storeBackoff)
	}
	want(t, "after the release", call(op, "pay-5", "user-1", `{}`, ok), ack, "settled")

	t.Run("InFlight", func(t *testing.T) {
		inside, leave := make(chan struct{}), make(chan struct{})
		first := make(chan verdict, 1)
		go func() {
			first <- call(op, "pay-6", "user-1", `{}`, func(context.Context) (receipt, error) {
				close(inside)
				<-leave
				return receipt{}, nil
			})
		}()
		<-inside
		v := call(op, "pay-6", "user-1", `{}`, ok)
		close(leave)
		want(t, "while the first runs", v, nak, "in_flight")
		if v.delay != np.max { // the answer's 5s, capped
			t.Errorf("in flight: delay %v, want the cap %v", v.delay, np.max)
		}
		want(t, "the first", <-first, ack, "settled")
	})
	t.Run("StoreUnavailable", func(t *testing.T) {
		full := newOp(t, idempotency.NewMemoryStore(idempotency.MemoryMaxRows(1)), idempotency.Config{}, idempotency.RouteConfig{})
		want(t, "the one row", call(full, "pay-7", "user-1", `{}`, ok), ack, "settled")
		want(t, "a full store", call(full, "pay-8", "user-1", `{}`, ok), nak, "store_unavailable")
	})
	t.Run("ResponseNotStored", func(t *testing.T) {
		small := newOp(t, idempotency.NewMemoryStore(), idempotency.Config{}, idempotency.RouteConfig{MaxResponseBytes: 1})
		want(t, "first run", call(small, "pay-9", "user-1", `{}`, ok), ack, "settled")
		want(t, "redelivery", call(small, "pay-9", "user-1", `{}`, ok), deadLetter, "response_not_stored")
	})
	t.Run("KillSwitch", func(t *testing.T) {
		off := newOp(t, idempotency.NewMemoryStore(), idempotency.Config{Enabled: func(context.Context) bool { return false }}, idempotency.RouteConfig{})
		want(t, "switched off", call(off, "pay-10", "user-1", `{}`, ok), ack, "bypassed")
	})
	t.Run("OutcomeUnknown", func(t *testing.T) { // an ordinary operation's owner that died: matched as Do returns it
		v := np.judge(idempotency.CallInfo{}, fmt.Errorf("answer: %w", idempotency.ErrOutcomeUnknown), false, 1)
		want(t, "outcome unknown", v, deadLetter, "outcome_unknown")
	})
}

// TestBackoff: store-unavailable nacks double per delivery up to the cap.
func TestBackoff(t *testing.T) {
	np := nakPolicy{max: time.Second}
	for deliveries, want := range map[uint64]time.Duration{1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 3: time.Second, 4: time.Second, 60: time.Second} {
		if got := np.backoff(deliveries); got != want {
			t.Errorf("backoff(%d) = %v, want %v", deliveries, got, want)
		}
	}
}
