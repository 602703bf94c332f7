package idemgrpc_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/idemrpc"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestUnsettled: a method that returns idemgrpc.Unsettled gets Unavailable
// IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo of 1s and nothing
// recorded; the retry reconciles the key through the method's hook (its
// answer replayed), or answers FailedPrecondition
// IDEMPOTENCY_OUTCOME_UNKNOWN without a hook; on memory and PostgreSQL.
func TestUnsettled(t *testing.T) {
	stores := map[string]func(t *testing.T) idempotency.Store{
		"Memory":   func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() },
		"Postgres": func(t *testing.T) idempotency.Store { return idempotency.NewPostgresStore(testdb.New(t)) },
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			var r runs
			mw, _ := newMiddleware(t, newStore(t), idempotency.Config{Lease: 5 * time.Second, StoreTimeout: time.Second})
			hook := func(context.Context, idempotency.ReconcileInfo) (any, error) {
				return idemrpc.Record(0, &grpc_testing.SimpleResponse{ServerId: "venue"}, "", nil, http.Header{}), nil
			}
			addr := serve(t, mw, map[string]idemgrpc.Method{
				svc + "Reconciled": {Route: idempotency.RouteConfig{Reconcile: hook}},
				svc + "Unknown":    {},
			}, func(ctx context.Context, _ string, _ *grpc_testing.SimpleRequest) (*grpc_testing.SimpleResponse, error) {
				r.note(ctx)
				return nil, idemgrpc.Unsettled("venue: timeout")
			}, "Reconciled", "Unknown")
			cc := dial(t, addr)
			key := uuid.NewString()
			_, err := invoke(withKey(t.Context(), key), cc, "Reconciled", request("a", codes.OK))
			wantAnswer(t, "unsettled", err, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
			var h metadata.MD
			resp, err := invoke(withKey(t.Context(), key), cc, "Reconciled", request("a", codes.OK), grpc.Header(&h))
			if err != nil || resp.GetServerId() != "venue" || !replayed(h) || r.count(key) != 1 {
				t.Fatalf("retry: %v %v replayed %v, %d runs; want the hook's answer replayed, 1 run", resp, err, replayed(h), r.count(key))
			}
			other := uuid.NewString()
			_, err = invoke(withKey(t.Context(), other), cc, "Unknown", request("a", codes.OK))
			wantAnswer(t, "unsettled", err, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
			_, err = invoke(withKey(t.Context(), other), cc, "Unknown", request("a", codes.OK))
			wantAnswer(t, "retry without a hook", err, codes.FailedPrecondition, "IDEMPOTENCY_OUTCOME_UNKNOWN", 0)
			if r.count(other) != 1 {
				t.Fatalf("%d runs, want 1", r.count(other))
			}
		})
	}
}
