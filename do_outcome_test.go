package idempotency_test

import (
	"context"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	"github.com/prometheus/client_golang/prometheus"
)

// TestExecOutcome: an adapter's Response names its outcome under ":outcome"
// where the transport's code and its HTTP status disagree (gRPC's
// Unimplemented is a 501 that completes; Aborted a 409 that fails); the
// name is not stored, and the status is recorded as given.
func TestExecOutcome(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		mw, err := idempotency.New(store, idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
			Enabled: func(context.Context) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		op, err := mw.Operation("grpc:/payments.v1.Ledger/Settle", idempotency.RouteConfig{MinKeyLength: 16})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		exec := func(key string, status int, outcome string) (idempotency.Response, idempotency.CallInfo, error) {
			return op.Exec(t.Context(), idempotency.Call{Key: key, Request: []byte{0}}, func(context.Context) idempotency.Response {
				runs.Add(1)
				return idempotency.Response{Status: status, Header: map[string][]string{":outcome": {outcome}, ":grpc": {"12"}},
					Body: []byte{}, BodyKind: idempotency.BodyRaw}
			})
		}
		done := uuid.NewString()
		_, _, _ = exec(done, 501, "complete")
		resp, info, err := exec(done, 501, "complete")
		if err != nil || !info.Replayed || resp.Status != 501 || len(resp.Header) != 1 || !reflect.DeepEqual(resp.Header[":grpc"], []string{"12"}) {
			t.Fatalf("a 501 named complete: %+v %+v %v; want its replay, status 501, without :outcome", resp, info, err)
		}
		failed := uuid.NewString()
		_, _, _ = exec(failed, 409, "fail")
		_, _, err = exec(failed, 409, "fail")
		wantAnswer(t, "a 409 named fail", err, idempotency.ErrPreviousFailed, 409)
		released := uuid.NewString()
		_, _, _ = exec(released, 200, "release")
		if _, info, err := exec(released, 200, "release"); err != nil || info.Replayed {
			t.Fatalf("a 200 named release: %+v %v; want a new run", info, err)
		}
		if runs.Load() != 4 {
			t.Fatalf("%d runs, want 4", runs.Load())
		}
	})
}

// TestExecMissingKey: a call without a key is the contract's missing-key
// answer (idempotency_key_required), still ErrInvalidKey, so an adapter
// whose method requires a key counts it as missing_key.
func TestExecMissingKey(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	op, err := mw.Operation("settle", idempotency.RouteConfig{MinKeyLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = op.Exec(t.Context(), idempotency.Call{}, func(context.Context) idempotency.Response {
		t.Fatal("ran without a key")
		return idempotency.Response{}
	})
	ea := wantAnswer(t, "no key", err, idempotency.ErrInvalidKey, 400)
	if !strings.HasSuffix(ea.Type, "idempotency_key_required") {
		t.Fatalf("no key: type %q, want idempotency_key_required", ea.Type)
	}
	// Outside HTTP there is no header: the error speaks of a key.
	if msg := err.Error(); strings.Contains(msg, "header") || strings.Contains(msg, "Idempotency-Key") || !strings.Contains(msg, "idempotency key") {
		t.Fatalf("no key: %q, want a message about the idempotency key, not a header", msg)
	}
}
