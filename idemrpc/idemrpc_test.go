package idemrpc

import (
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// TestAnswerOfMapsTheKind: an answer is mapped by its Kind, never by its
// problem type URI (a host's ProblemTypeBase cannot change the code), and
// an unknown kind is Internal.
func TestAnswerOfMapsTheKind(t *testing.T) {
	for _, c := range []struct {
		ea     idempotency.ErrorAnswer
		code   uint32
		reason string
		retry  time.Duration
	}{
		{idempotency.ErrorAnswer{Kind: "idempotency_in_flight", Type: "urn:x", RetryAfterMS: 5000}, codeAborted, "IDEMPOTENCY_IN_FLIGHT", 5 * time.Second},
		{idempotency.ErrorAnswer{Kind: "idempotency_store_unavailable"}, codeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second},
		{idempotency.ErrorAnswer{Kind: "idempotency_key_required", Type: "https://x/idempotency_in_flight"}, codeInvalidArgument, "IDEMPOTENCY_KEY_REQUIRED", 0},
		{idempotency.ErrorAnswer{Kind: "idempotency_key_expired"}, codeFailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED", 0},
		{idempotency.ErrorAnswer{Kind: "something_else"}, codeInternal, "IDEMPOTENCY_INTERNAL", 0},
	} {
		a := AnswerOf(&c.ea)
		if a.Code != c.code || a.Reason != c.reason || a.RetryDelay != c.retry {
			t.Errorf("%s: %+v, want code %d, reason %s, retry %v", c.ea.Kind, a, c.code, c.reason, c.retry)
		}
	}
}
