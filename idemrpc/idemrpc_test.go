package idemrpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

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

// TestExpiresFormat: an expiry is RFC 3339 UTC with whole seconds, rounded
// down from any zone and fraction; the zero time is none, in an answer's
// ErrorInfo metadata too.
func TestExpiresFormat(t *testing.T) {
	at := time.Date(2026, 7, 11, 14, 0, 0, 999_999_000, time.FixedZone("CEST", 2*3600))
	if got := FormatExpires(at); got != "2026-07-11T12:00:00Z" {
		t.Fatalf("FormatExpires = %q, want 2026-07-11T12:00:00Z", got)
	}
	if got := FormatExpires(time.Time{}); got != "" {
		t.Fatalf("FormatExpires(zero) = %q, want none", got)
	}
	a := AnswerOf(&idempotency.ErrorAnswer{Kind: "idempotency_previous_failed", Expires: at})
	if a.Metadata["expires_at"] != "2026-07-11T12:00:00Z" {
		t.Fatalf("ErrorInfo metadata %v, want expires_at", a.Metadata)
	}
	if a = AnswerOf(&idempotency.ErrorAnswer{Kind: "idempotency_store_unavailable"}); a.Metadata["expires_at"] != "" {
		t.Fatalf("an answer without a row: metadata %v", a.Metadata)
	}
}

// lostLeaseStore is a MemoryStore whose every renewal finds the key taken.
type lostLeaseStore struct{ *idempotency.MemoryStore }

func (lostLeaseStore) Renew(context.Context, idempotency.Fence, idempotency.ClaimRequest) error {
	return idempotency.ErrNotOwner
}

// TestAnswerOfLeaseLost: a Heartbeat call whose lease was lost, as Do
// returns it, is Unavailable with the reason IDEMPOTENCY_LEASE_LOST and
// the store outage's retry delay.
func TestAnswerOfLeaseLost(t *testing.T) {
	mw, err := idempotency.New(lostLeaseStore{idempotency.NewMemoryStore()},
		idempotency.Config{Lease: 300 * time.Millisecond, StoreTimeout: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	op, err := mw.Operation("grpc:/pkg.Svc/Charge", idempotency.RouteConfig{Heartbeat: true, MaxRun: time.Minute, MinKeyLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = idempotency.Do(context.Background(), op, idempotency.Call{Key: "a-key-of-sixteen-bytes"}, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, nil
	})
	var ea *idempotency.ErrorAnswer
	if !errors.As(err, &ea) {
		t.Fatalf("Do: %v, want an *ErrorAnswer", err)
	}
	if a := AnswerOf(ea); a.Code != codeUnavailable || a.Reason != ReasonLeaseLost || a.RetryDelay != time.Second {
		t.Errorf("AnswerOf a lost lease: %+v, want Unavailable, %s, retry 1s", a, ReasonLeaseLost)
	}
}

// TestRecordNilHeader: a Reconcile hook that has no headers to keep may
// pass a nil header to Record: the answer is stored as with an empty one.
func TestRecordNilHeader(t *testing.T) {
	msg := wrapperspb.String("venue")
	for _, code := range []uint32{0, 5} {
		got := Record(code, msg, "not found", nil, nil)
		want := Record(code, msg, "not found", nil, http.Header{})
		if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !reflect.DeepEqual(got.Header, want.Header) {
			t.Errorf("code %d: Record with a nil header = %+v, with an empty one %+v", code, got, want)
		}
	}
}
