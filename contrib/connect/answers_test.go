package idemconnect_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"
)

// errorInfo is err's ErrorInfo detail, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, _ := d.Value(); v != nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info
			}
		}
	}
	return nil
}

// staleStore answers a claim of a key starting "stale-" with an in-flight
// row whose lease ran out, as a crashed owner leaves it.
type staleStore struct{ idempotency.Store }

func (s staleStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if strings.HasPrefix(req.Key, "stale-") {
		return idempotency.ClaimResult{Record: idempotency.Record{Key: req.Key, RequestHash: req.RequestHash,
			Status: idempotency.StatusInFlight, LeaseOver: true}}, nil
	}
	if strings.HasPrefix(req.Key, "tomb-") { // a tombstone (ExpiredRefuse): another request's hash
		return idempotency.ClaimResult{Record: idempotency.Record{Key: req.Key, RequestHash: strings.Repeat("0", 64),
			Status: idempotency.StatusCompleted, Expired: true, Tombstone: true, LeaseOver: true}}, nil
	}
	return s.Store.Claim(ctx, req)
}

// TestMoreAnswers: over each protocol, the answers TestAnswers leaves
// out: two keys, a scope too long, an owner whose lease ran out (outcome
// unknown), a response over the storable size (not stored, with its
// original_status), and a replay the audit hook refuses (Unavailable with
// a RetryInfo, the method not run again).
func TestMoreAnswers(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(staleStore{idempotency.NewMemoryStore()}, idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true },
		Scope: func(ctx context.Context) string {
			info, ok := connect.CallInfoForHandlerContext(ctx)
			if !ok {
				return ""
			}
			return info.RequestHeader().Get("X-User")
		},
		OnReplay: func(_ context.Context, ev idempotency.ReplayEvent) error {
			if strings.HasPrefix(ev.Key, "audit-fail-") {
				return errors.New("the audit table is down")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &counter{}
	base := serveProcs(t, mw, map[string]idemconnect.Method{
		svc + "Transfer": {},
		svc + "Small":    {Route: idempotency.RouteConfig{MaxResponseBytes: 4}},
	}, map[string]procFunc{svc + "Transfer": counted(r), svc + "Small": counted(r)})
	hc := h2cClient()
	for _, w := range wires {
		ctx := t.Context()
		transfer, small := dialProc(hc, base, svc+"Transfer", w), dialProc(hc, base, svc+"Small", w)

		req := connectRequest(must(structpb.NewStruct(map[string]any{"a": 1})), "k1")
		req.Header().Add(idemconnect.KeyHeader, "k2")
		_, err := transfer.CallUnary(ctx, req)
		wantAnswer(t, w.name+": two keys", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0)

		req = connectRequest(must(structpb.NewStruct(map[string]any{"a": 1})), uuid.NewString())
		req.Header().Set("X-User", strings.Repeat("u", 1025))
		_, err = transfer.CallUnary(ctx, req)
		wantAnswer(t, w.name+": a 1025-byte scope", err, connect.CodeInvalidArgument, "IDEMPOTENCY_SCOPE_INVALID", 0)

		_, err = call(ctx, transfer, "stale-"+uuid.NewString(), map[string]any{"a": 1})
		wantAnswer(t, w.name+": stale in flight", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_OUTCOME_UNKNOWN", 0)

		_, err = call(ctx, transfer, "tomb-"+uuid.NewString(), map[string]any{"a": 1})
		wantAnswer(t, w.name+": a tombstone", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED", 0)

		big := uuid.NewString()
		if _, err := call(ctx, small, big, map[string]any{"a": "more than four bytes"}); err != nil {
			t.Fatal(err)
		}
		_, err = call(ctx, small, big, map[string]any{"a": "more than four bytes"})
		wantAnswer(t, w.name+": not stored", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_RESPONSE_NOT_STORED", 0)
		if md := errorInfo(err).GetMetadata(); md["original_status"] != "200" {
			t.Fatalf("%s: not stored: metadata %v; want original_status 200", w.name, md)
		}

		audit := "audit-fail-" + uuid.NewString()
		if _, err := call(ctx, transfer, audit, map[string]any{"a": 1}); err != nil {
			t.Fatal(err)
		}
		_, err = call(ctx, transfer, audit, map[string]any{"a": 1})
		wantAnswer(t, w.name+": replay hook failed", err, connect.CodeUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
		if r.count(audit) != 1 {
			t.Fatalf("%s: ran %d times after a refused replay, want 1", w.name, r.count(audit))
		}
	}
}

// TestKillSwitch: with the kill-switch off every call runs, nothing is
// replayed, and the bypass is counted under the procedure's endpoint.
func TestKillSwitch(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Registerer: reg, Logger: quiet, Enabled: func(context.Context) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	r := &counter{}
	base := serveProcs(t, mw, map[string]idemconnect.Method{svc + "Transfer": {RequireKey: true}},
		map[string]procFunc{svc + "Transfer": counted(r)})
	c := dialProc(h2cClient(), base, svc+"Transfer", wires[0])
	key := uuid.NewString()
	for range 2 {
		if resp, err := call(t.Context(), c, key, map[string]any{"a": 1}); err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" {
			t.Fatalf("%v %v", resp, err)
		}
	}
	if r.count(key) != 2 {
		t.Fatalf("ran %d times with the kill-switch off, want 2", r.count(key))
	}
	if n := metricSum(t, reg, "idempotency_bypasses_total", "connect:"+svc+"Transfer"); n != 2 {
		t.Fatalf("idempotency_bypasses_total{endpoint=connect:%sTransfer} = %v, want 2", svc, n)
	}
}
