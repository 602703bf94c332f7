package idemconnect_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/idemrpc"
	"github.com/idemkit/idempotency/internal/testdb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestUnsettled: a procedure that returns idemconnect.Unsettled gets
// Unavailable IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo of 1s and
// nothing recorded; the retry reconciles through the method's hook (its
// answer replayed), or answers FailedPrecondition
// IDEMPOTENCY_OUTCOME_UNKNOWN without one; over PostgreSQL, each wire.
func TestUnsettled(t *testing.T) {
	mw := pgMiddleware(t, testdb.New(t), idempotency.Config{Lease: 5 * time.Second, StoreTimeout: time.Second})
	var runs atomic.Int64
	venue := &structpb.Struct{Fields: map[string]*structpb.Value{"run": structpb.NewStringValue("venue")}}
	hook := func(context.Context, idempotency.ReconcileInfo) (any, error) {
		return idemrpc.Record(0, venue, "", nil, http.Header{}), nil
	}
	unsettled := func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		runs.Add(1)
		return nil, idemconnect.Unsettled("venue: timeout")
	}
	base := serveProcs(t, mw, map[string]idemconnect.Method{
		svc + "Reconciled": {Route: idempotency.RouteConfig{Reconcile: hook}},
		svc + "Unknown":    {},
	}, map[string]procFunc{svc + "Reconciled": unsettled, svc + "Unknown": unsettled})
	for _, w := range wires {
		t.Run(w.name, func(t *testing.T) {
			before := runs.Load()
			c := dialProc(h2cClient(), base, svc+"Reconciled", w)
			key := uuid.NewString()
			_, err := c.CallUnary(t.Context(), connectRequest(&structpb.Struct{}, key))
			wantAnswer(t, "unsettled", err, connect.CodeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
			resp, err := c.CallUnary(t.Context(), connectRequest(&structpb.Struct{}, key))
			if err != nil || resp.Msg.GetFields()["run"].GetStringValue() != "venue" || resp.Header().Get(idemconnect.ReplayedHeader) != "true" {
				t.Fatalf("retry: %v %v, want the hook's answer replayed", resp, err)
			}
			u := dialProc(h2cClient(), base, svc+"Unknown", w)
			other := uuid.NewString()
			_, err = u.CallUnary(t.Context(), connectRequest(&structpb.Struct{}, other))
			wantAnswer(t, "unsettled", err, connect.CodeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
			_, err = u.CallUnary(t.Context(), connectRequest(&structpb.Struct{}, other))
			wantAnswer(t, "retry without a hook", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_OUTCOME_UNKNOWN", 0)
			if n := runs.Load() - before; n != 2 {
				t.Fatalf("%d runs, want 2 (one per key)", n)
			}
		})
	}
}
