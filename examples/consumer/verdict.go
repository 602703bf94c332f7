package main

import (
	"errors"
	"time"

	"github.com/idemkit/idempotency"
)

// action is what the consumer does with a delivery.
type action int

const (
	ack        action = iota // settled, declined or replayed: done
	nak                      // redeliver after the delay: the same key will be answered again
	deadLetter               // to the dead-letter stream with the reason, then Term: never redelivered
)

func (a action) String() string {
	return [...]string{"ack", "nak", "dead_letter"}[a]
}

// verdict is the consumer's answer to one delivery.
type verdict struct {
	act    action
	answer string        // what Do answered, by name (the dead letter's reason)
	delay  time.Duration // nak: when to redeliver
	err    error         // what went wrong, if anything
}

// nakPolicy bounds the delays of nacks.
type nakPolicy struct {
	max time.Duration // no nack waits longer
}

// storeBackoff is the first delay after a store-unavailable answer; it
// doubles with each delivery, up to the policy's max.
const storeBackoff = 250 * time.Millisecond

// judge maps Do's answer to an action (docs/entry-points.md, "Consumers"): a result, a
// decline or a replay is acked; in flight, the store unavailable, and a
// released key are nacked with a delay, since the same key will be
// answered again; everything else (previous failed, outcome unknown,
// mismatch, a key or scope that cannot be stored, the function's own
// failure) is dead-lettered, never acked silently and never requeued for
// ever. A released key is the function's Retryable error, as Do returns it
// (errors.Is ErrRetryable).
func (np nakPolicy) judge(info idempotency.CallInfo, err error, deliveries uint64) verdict {
	var (
		ea       *idempotency.ErrorAnswer
		rejected *idempotency.PermanentError
	)
	switch {
	case err == nil && info.Bypassed:
		return verdict{act: ack, answer: "bypassed"}
	case err == nil && info.Replayed:
		return verdict{act: ack, answer: "replayed"}
	case err == nil:
		return verdict{act: ack, answer: "settled"}
	case errors.As(err, &rejected):
		return verdict{act: ack, answer: "declined", err: err}
	case errors.Is(err, idempotency.ErrInFlight):
		delay := np.max
		if errors.As(err, &ea) && ea.RetryAfterMS > 0 {
			delay = min(delay, time.Duration(ea.RetryAfterMS)*time.Millisecond)
		}
		return verdict{act: nak, answer: "in_flight", delay: delay, err: err}
	case errors.Is(err, idempotency.ErrStoreUnavailable):
		return verdict{act: nak, answer: "store_unavailable", delay: np.backoff(deliveries), err: err}
	case answerName(err) != "":
		return verdict{act: deadLetter, answer: answerName(err), err: err}
	case errors.As(err, &ea): // an answer the table above does not know yet
		return verdict{act: deadLetter, answer: ea.Code, err: err}
	case errors.Is(err, idempotency.ErrRetryable):
		return verdict{act: nak, answer: "released", delay: np.backoff(deliveries), err: err}
	}
	return verdict{act: deadLetter, answer: "failed", err: err} // the key failed: every redelivery gets previous_failed
}

// backoff is storeBackoff doubled per delivery after the first, up to max.
func (np nakPolicy) backoff(deliveries uint64) time.Duration {
	d := storeBackoff
	for i := uint64(1); i < deliveries && d < np.max; i++ {
		d *= 2
	}
	return min(d, np.max)
}

// answerName names a dead-lettered answer: "" for none of these.
func answerName(err error) string {
	for _, a := range []struct {
		err  error
		name string
	}{
		{idempotency.ErrPreviousFailed, "previous_failed"},
		{idempotency.ErrOutcomeUnknown, "outcome_unknown"},
		{idempotency.ErrMismatch, "mismatch"},
		{idempotency.ErrResponseNotStored, "response_not_stored"},
		{idempotency.ErrInvalidKey, "invalid_key"},
		{idempotency.ErrInvalidScope, "invalid_scope"},
	} {
		if errors.Is(err, a.err) {
			return a.name
		}
	}
	return ""
}
