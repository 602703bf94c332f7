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

// The consumer's own branching, on the memory store: what it does with a
// delivery for each answer Do gives.

var testNaks = nakPolicy{max: time.Second}

// judgeOp is the consumer's Operation over s: Scoped, as main's (every
// call carries the payment's user).
func judgeOp(t *testing.T, s idempotency.Store, cfg idempotency.Config, rc idempotency.RouteConfig) *idempotency.Operation {
	t.Helper()
	rc.Scoped = true
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

// judgeCall runs fn through Do on its first delivery and judges the answer;
// an error starting "transient" is returned as the function's Retryable one.
func judgeCall(t *testing.T, op *idempotency.Operation, key, scope, body string, fn func(context.Context) (receipt, error)) verdict {
	_, info, err := idempotency.Do(t.Context(), op, idempotency.Call{Key: key, Scope: scope, Request: []byte(body)},
		func(ctx context.Context) (receipt, error) {
			r, err := fn(ctx)
			if err != nil && strings.HasPrefix(err.Error(), "transient") {
				return r, idempotency.Retryable(err)
			}
			return r, err
		})
	return testNaks.judge(info, err, 1)
}

func wantVerdict(t *testing.T, step string, v verdict, act action, answer string) {
	t.Helper()
	if v.act != act || v.answer != answer {
		t.Errorf("%s: %v %q (%v); want %v %q", step, v.act, v.answer, v.err, act, answer)
	}
}

func settles(context.Context) (receipt, error) { return receipt{LedgerID: 1}, nil }

// TestJudge: a result, a replay and a decline are acked; a mismatch, a bad
// key or scope, the function's failure and what follows it are
// dead-lettered; a retryable failure is nacked and the redelivery runs.
func TestJudge(t *testing.T) {
	t.Parallel()
	op := judgeOp(t, idempotency.NewMemoryStore(), idempotency.Config{}, idempotency.RouteConfig{})
	wantVerdict(t, "first run", judgeCall(t, op, "pay-1", "user-1", `{"a":1}`, settles), ack, "settled")
	wantVerdict(t, "redelivery", judgeCall(t, op, "pay-1", "user-1", `{"a":1}`, settles), ack, "replayed")
	wantVerdict(t, "the id on another body", judgeCall(t, op, "pay-1", "user-1", `{"a":2}`, settles), deadLetter, "mismatch")
	wantVerdict(t, "no key", judgeCall(t, op, "", "user-1", `{}`, settles), deadLetter, "invalid_key")
	wantVerdict(t, "a key over 255 bytes", judgeCall(t, op, strings.Repeat("k", 256), "user-1", `{}`, settles), deadLetter, "invalid_key")
	wantVerdict(t, "a scope with a NUL byte", judgeCall(t, op, "pay-2", "user\x00", `{}`, settles), deadLetter, "invalid_scope")

	declined := func(context.Context) (receipt, error) {
		return receipt{}, &idempotency.PermanentError{Code: "invalid_amount", Message: "no"}
	}
	wantVerdict(t, "declined", judgeCall(t, op, "pay-3", "user-1", `{}`, declined), ack, "declined")
	wantVerdict(t, "declined, redelivered", judgeCall(t, op, "pay-3", "user-1", `{}`, settles), ack, "declined")

	failing := func(context.Context) (receipt, error) { return receipt{}, errors.New("ledger: check violation") }
	wantVerdict(t, "the function fails", judgeCall(t, op, "pay-4", "user-1", `{}`, failing), deadLetter, "failed")
	wantVerdict(t, "after a failure", judgeCall(t, op, "pay-4", "user-1", `{}`, settles), deadLetter, "previous_failed")

	transient := func(context.Context) (receipt, error) {
		return receipt{}, idempotency.Retryable(errors.New("transient: connection reset"))
	}
	v := judgeCall(t, op, "pay-5", "user-1", `{}`, transient)
	wantVerdict(t, "a retryable failure", v, nak, "released")
	if v.delay != storeBackoff {
		t.Errorf("released: delay %v, want %v", v.delay, storeBackoff)
	}
	wantVerdict(t, "after the release", judgeCall(t, op, "pay-5", "user-1", `{}`, settles), ack, "settled")
}

// TestJudgeAnswers: in flight and the store unavailable are nacked with a
// delay; a result that was not stored is dead-lettered; a switched-off
// library acks its bypass.
func TestJudgeAnswers(t *testing.T) {
	t.Parallel()
	t.Run("InFlight", func(t *testing.T) {
		op := judgeOp(t, idempotency.NewMemoryStore(), idempotency.Config{}, idempotency.RouteConfig{})
		inside, leave := make(chan struct{}), make(chan struct{})
		first := make(chan verdict, 1)
		go func() {
			first <- judgeCall(t, op, "pay-6", "user-1", `{}`, func(context.Context) (receipt, error) {
				close(inside)
				<-leave
				return receipt{}, nil
			})
		}()
		<-inside
		v := judgeCall(t, op, "pay-6", "user-1", `{}`, settles)
		close(leave)
		wantVerdict(t, "while the first runs", v, nak, "in_flight")
		if v.delay != testNaks.max { // the answer's 5s, capped
			t.Errorf("in flight: delay %v, want the cap %v", v.delay, testNaks.max)
		}
		wantVerdict(t, "the first", <-first, ack, "settled")
	})
	t.Run("StoreUnavailable", func(t *testing.T) {
		full := judgeOp(t, idempotency.NewMemoryStore(idempotency.MemoryMaxRows(1)), idempotency.Config{}, idempotency.RouteConfig{})
		wantVerdict(t, "the one row", judgeCall(t, full, "pay-7", "user-1", `{}`, settles), ack, "settled")
		wantVerdict(t, "a full store", judgeCall(t, full, "pay-8", "user-1", `{}`, settles), nak, "store_unavailable")
	})
	t.Run("ResponseNotStored", func(t *testing.T) {
		small := judgeOp(t, idempotency.NewMemoryStore(), idempotency.Config{}, idempotency.RouteConfig{MaxResponseBytes: 1})
		wantVerdict(t, "first run", judgeCall(t, small, "pay-9", "user-1", `{}`, settles), ack, "settled")
		wantVerdict(t, "redelivery", judgeCall(t, small, "pay-9", "user-1", `{}`, settles), deadLetter, "response_not_stored")
	})
	t.Run("KillSwitch", func(t *testing.T) { // for endpoints: the consumer's Operation keeps deduplicating
		switchedOff := idempotency.Config{Enabled: func(context.Context) bool { return false }}
		off := judgeOp(t, idempotency.NewMemoryStore(), switchedOff, idempotency.RouteConfig{})
		wantVerdict(t, "switched off", judgeCall(t, off, "pay-10", "user-1", `{}`, settles), ack, "settled")
		wantVerdict(t, "its redelivery", judgeCall(t, off, "pay-10", "user-1", `{}`, settles), ack, "replayed")
		follows := judgeOp(t, idempotency.NewMemoryStore(), switchedOff, idempotency.RouteConfig{FollowKillSwitch: true})
		wantVerdict(t, "following the switch", judgeCall(t, follows, "pay-10", "user-1", `{}`, settles), ack, "bypassed")
	})
	t.Run("OutcomeUnknown", func(t *testing.T) { // an ordinary operation's owner that died: matched as Do returns it
		v := testNaks.judge(idempotency.CallInfo{}, fmt.Errorf("answer: %w", idempotency.ErrOutcomeUnknown), 1)
		wantVerdict(t, "outcome unknown", v, deadLetter, "outcome_unknown")
	})
}

// TestBackoff: store-unavailable nacks double per delivery up to the cap.
func TestBackoff(t *testing.T) {
	for deliveries, want := range map[uint64]time.Duration{1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 3: time.Second, 4: time.Second, 60: time.Second} {
		if got := testNaks.backoff(deliveries); got != want {
			t.Errorf("backoff(%d) = %v, want %v", deliveries, got, want)
		}
	}
}
