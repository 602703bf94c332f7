package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

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

// answerServer serves Transfer (optional key), Settle (key required), Slow
// (blocks until release), Small (a 4-byte response limit) and Meta (sets
// metadata) over a memory store.
func answerServer(t *testing.T, cfg idempotency.Config) (*grpc.ClientConn, *runs, chan struct{}, chan struct{}) {
	t.Helper()
	mw, _ := newMiddleware(t, staleStore{idempotency.NewMemoryStore()}, cfg)
	r := &runs{}
	started, release := make(chan struct{}, 1), make(chan struct{})
	h := func(ctx context.Context, method string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		id := r.note(ctx)
		switch method {
		case svc + "Slow":
			started <- struct{}{}
			<-release
		case svc + "Meta":
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-receipt", "r-"+id, "x-secret", "s"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-receipt", "t-"+id))
		}
		return answer(req, id)
	}
	methods := map[string]idemgrpc.Method{
		svc + "Transfer": {},
		svc + "Settle":   {RequireKey: true},
		svc + "Slow":     {},
		svc + "Small":    {Route: idempotency.RouteConfig{MaxResponseBytes: 4}},
		svc + "Meta":     {ReplayMetadata: []string{"X-Receipt"}},
	}
	addr := serve(t, mw, methods, h, "Transfer", "Settle", "Slow", "Small", "Meta", "Unlisted")
	return dial(t, addr), r, started, release
}

// TestReplay: a retry with the key gets the first answer, its allow-listed
// metadata and idempotent-replayed: true; the method ran once.
func TestReplay(t *testing.T) {
	t.Parallel()
	cc, r, _, _ := answerServer(t, idempotency.Config{})
	key := uuid.NewString()
	var h1, t1, h2, t2 metadata.MD
	first, err := invoke(withKey(t.Context(), key), cc, "Meta", request("pay 10", codes.OK), grpc.Header(&h1), grpc.Trailer(&t1))
	if err != nil || replayed(h1) || len(h1.Get("x-secret")) != 1 {
		t.Fatalf("first: %v %v header %v", first, err, h1)
	}
	again, err := invoke(withKey(t.Context(), key), cc, "Meta", request("pay 10", codes.OK), grpc.Header(&h2), grpc.Trailer(&t2))
	if err != nil || !proto.Equal(first, again) || !replayed(h2) {
		t.Fatalf("retry: %v %v header %v; want the first answer %v, replayed", again, err, h2, first)
	}
	if got := h2.Get("x-receipt"); len(got) != 1 || got[0] != h1.Get("x-receipt")[0] || len(h2.Get("x-secret")) != 0 {
		t.Fatalf("replayed header %v; want x-receipt %v and no x-secret", h2, h1.Get("x-receipt"))
	}
	if got := t2.Get("x-receipt"); len(got) != 1 || got[0] != t1.Get("x-receipt")[0] {
		t.Fatalf("replayed trailer %v; want %v", t2, t1)
	}
	if n := r.count(key); n != 1 {
		t.Fatalf("ran %d times", n)
	}
	// Without a key an optional method passes through; an unlisted one too.
	for _, m := range []string{"Transfer", "Unlisted"} {
		for range 2 {
			if _, err := invoke(t.Context(), cc, m, request("x", codes.OK)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := r.count(""); n != 4 {
		t.Fatalf("keyless calls ran %d times, want 4", n)
	}
}

// TestAnswers: each of the contract's answers, by its code, ErrorInfo and
// RetryInfo.
func TestAnswers(t *testing.T) {
	t.Parallel()
	cc, _, started, release := answerServer(t, idempotency.Config{Scope: func(ctx context.Context) string {
		vs := metadata.ValueFromIncomingContext(ctx, "x-user")
		return strings.Join(vs, "")
	}})
	ctx := t.Context()

	slow := uuid.NewString()
	done := make(chan error, 1)
	go func() { _, err := invoke(withKey(ctx, slow), cc, "Slow", request("a", codes.OK)); done <- err }()
	<-started
	_, err := invoke(withKey(ctx, slow), cc, "Slow", request("a", codes.OK))
	wantAnswer(t, "in flight", err, codes.Aborted, "IDEMPOTENCY_IN_FLIGHT", 5*time.Second)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, err = invoke(withKey(ctx, slow), cc, "Slow", request("b", codes.OK))
	wantAnswer(t, "mismatch", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_BODY_MISMATCH", 0)

	_, err = invoke(ctx, cc, "Settle", request("a", codes.OK))
	wantAnswer(t, "no key, required", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_REQUIRED", 0)
	if msg := status.Convert(err).Message(); strings.Contains(msg, "header") || !strings.Contains(msg, "idempotency key") {
		t.Fatalf("no key: message %q, want one about the idempotency key, not a header", msg)
	}
	_, err = invoke(withKey(ctx, strings.Repeat("k", 256)), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "a 256-byte key", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0)
	_, err = invoke(withKey(withKey(ctx, "k1"), "k2"), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "two keys", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0)
	_, err = invoke(metadata.AppendToOutgoingContext(withKey(ctx, uuid.NewString()), "x-user", strings.Repeat("u", 1025)), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "a 1025-byte scope", err, codes.InvalidArgument, "IDEMPOTENCY_SCOPE_INVALID", 0)

	failed := uuid.NewString()
	_, err = invoke(withKey(ctx, failed), cc, "Transfer", request("a", codes.Internal))
	if status.Code(err) != codes.Internal {
		t.Fatalf("the handler's Internal: %v", err)
	}
	_, err = invoke(withKey(ctx, failed), cc, "Transfer", request("a", codes.Internal))
	wantAnswer(t, "previous failed", err, codes.FailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED", 0)

	_, err = invoke(withKey(ctx, "stale-"+uuid.NewString()), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "stale in flight", err, codes.FailedPrecondition, "IDEMPOTENCY_OUTCOME_UNKNOWN", 0)

	_, err = invoke(withKey(ctx, "tomb-"+uuid.NewString()), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "a tombstone", err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED", 0)

	big := uuid.NewString()
	if _, err := invoke(withKey(ctx, big), cc, "Small", request("more than four bytes", codes.OK)); err != nil {
		t.Fatal(err)
	}
	_, err = invoke(withKey(ctx, big), cc, "Small", request("more than four bytes", codes.OK))
	info := wantAnswer(t, "not stored", err, codes.FailedPrecondition, "IDEMPOTENCY_RESPONSE_NOT_STORED", 0)
	if info.GetMetadata()["original_status"] != "200" {
		t.Fatalf("not stored: metadata %v; want original_status 200", info.GetMetadata())
	}
}

// TestHandlerCodes: the handler's code decides the outcome: the
// deterministic codes (Unimplemented, a 501, among them) complete and
// replay with their message and details; ResourceExhausted releases the
// key; Aborted (a 409) and the rest fail it.
func TestHandlerCodes(t *testing.T) {
	t.Parallel()
	cc, r, _, _ := answerServer(t, idempotency.Config{})
	ctx := t.Context()
	for code, want := range map[codes.Code]string{
		codes.InvalidArgument: "replay", codes.NotFound: "replay", codes.AlreadyExists: "replay",
		codes.PermissionDenied: "replay", codes.FailedPrecondition: "replay", codes.OutOfRange: "replay",
		codes.Unauthenticated: "replay", codes.Unimplemented: "replay",
		codes.ResourceExhausted: "release",
		codes.Canceled:          "fail", codes.Unknown: "fail", codes.DeadlineExceeded: "fail", codes.Aborted: "fail",
		codes.Internal: "fail", codes.Unavailable: "fail", codes.DataLoss: "fail",
	} {
		key := uuid.NewString()
		_, first := invoke(withKey(ctx, key), cc, "Transfer", request("a", code))
		var h metadata.MD
		_, again := invoke(withKey(ctx, key), cc, "Transfer", request("a", code), grpc.Header(&h))
		switch want {
		case "replay":
			if !proto.Equal(status.Convert(first).Proto(), status.Convert(again).Proto()) || !replayed(h) || r.count(key) != 1 {
				t.Errorf("%v: retry %v (header %v) after %d runs; want the replay of %v", code, again, h, r.count(key), first)
			}
			if d := status.Convert(again).Details(); len(d) != 1 || d[0].(*errdetails.ErrorInfo).GetReason() != "ASKED" {
				t.Errorf("%v: replayed details %v", code, d)
			}
		case "release":
			if status.Code(again) != code || replayed(h) || r.count(key) != 2 {
				t.Errorf("%v: retry %v after %d runs; want a second run", code, again, r.count(key))
			}
		case "fail":
			if st, _ := status.FromError(again); st.Code() != codes.FailedPrecondition || r.count(key) != 1 {
				t.Errorf("%v: retry %v after %d runs; want previous_failed", code, again, r.count(key))
			}
		}
	}
}

// TestKillSwitch: with the kill-switch off every call runs, nothing is
// replayed, and the bypass is counted under the full method name.
func TestKillSwitch(t *testing.T) {
	t.Parallel()
	mw, reg := newMiddleware(t, idempotency.NewMemoryStore(), idempotency.Config{Enabled: func(context.Context) bool { return false }})
	r := &runs{}
	addr := serve(t, mw, map[string]idemgrpc.Method{svc + "Transfer": {Route: idempotency.RouteConfig{MinKeyLength: 16}}}, // follows the switch without FollowKillSwitch
		func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			return answer(req, r.note(ctx))
		}, "Transfer")
	cc := dial(t, addr)
	key := uuid.NewString()
	for range 2 {
		var h metadata.MD
		if _, err := invoke(withKey(t.Context(), key), cc, "Transfer", request("a", codes.OK), grpc.Header(&h)); err != nil || replayed(h) {
			t.Fatalf("%v %v", err, h)
		}
	}
	if r.count(key) != 2 {
		t.Fatalf("ran %d times with the kill-switch off, want 2", r.count(key))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				found = found || mf.GetName() == "idempotency_bypasses_total" && l.GetValue() == "grpc:"+svc+"Transfer"
			}
		}
	}
	if !found || testutil.CollectAndCount(reg, "idempotency_bypasses_total") != 1 {
		t.Fatal("no idempotency_bypasses_total labelled grpc:" + svc + "Transfer")
	}
}

// TestReplayHookRefuses: a replay the audit hook (Config.OnReplay) refuses
// is Unavailable IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo on a
// fail-closed method, and the method does not run again.
func TestReplayHookRefuses(t *testing.T) {
	t.Parallel()
	cc, r, _, _ := answerServer(t, idempotency.Config{OnReplay: func(_ context.Context, ev idempotency.ReplayEvent) error {
		if ev.Endpoint != "grpc:"+svc+"Transfer" || ev.Adapter == "" {
			return fmt.Errorf("unexpected event %+v", ev)
		}
		return errors.New("the audit table is down")
	}})
	key := uuid.NewString()
	if _, err := invoke(withKey(t.Context(), key), cc, "Transfer", request("a", codes.OK)); err != nil {
		t.Fatal(err)
	}
	_, err := invoke(withKey(t.Context(), key), cc, "Transfer", request("a", codes.OK))
	wantAnswer(t, "replay hook failed", err, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
	if n := r.count(key); n != 1 {
		t.Fatalf("ran %d times after a refused replay, want 1", n)
	}
}
