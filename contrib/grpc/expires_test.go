package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

// TestExpires: the key's expiry, its row's expires_at rounded down to the
// second as RFC 3339 UTC, is the header metadata idempotency-expires of
// the handler's answer (an OK and an error alike) and of a replay, and the
// ErrorInfo metadata expires_at of the contract's answers about the row;
// an answer that read no row (a bad key) carries none, and no method may
// store it.
func TestExpires(t *testing.T) {
	t.Parallel()
	store := idempotency.NewMemoryStore()
	mw, _ := newMiddleware(t, store, idempotency.Config{})
	r := &runs{}
	addr := serve(t, mw, map[string]idemgrpc.Method{svc + "Transfer": {}},
		func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs(idemgrpc.ExpiresKey, "the handler's"))
			return answer(req, r.note(ctx))
		}, "Transfer")
	cc := dial(t, addr)
	ctx := t.Context()
	expiresOf := func(key string) string {
		recs, err := store.ExportScope(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.Key == key {
				return rec.ExpiresAt.UTC().Truncate(time.Second).Format("2006-01-02T15:04:05Z")
			}
		}
		t.Fatalf("no row for %s", key)
		return ""
	}
	header := func(what string, h metadata.MD, want string) {
		t.Helper()
		if got := h.Get(idemgrpc.ExpiresKey); len(got) != 1 || got[0] != want {
			t.Fatalf("%s: %s %v, want [%s]", what, idemgrpc.ExpiresKey, got, want)
		}
	}

	key := uuid.NewString()
	var h1, h2 metadata.MD
	if _, err := invoke(withKey(ctx, key), cc, "Transfer", request("a", codes.OK), grpc.Header(&h1)); err != nil {
		t.Fatal(err)
	}
	want := expiresOf(key)
	header("first", h1, want)
	if _, err := invoke(withKey(ctx, key), cc, "Transfer", request("a", codes.OK), grpc.Header(&h2)); err != nil || !replayed(h2) {
		t.Fatalf("replay: %v %v", err, h2)
	}
	header("replay", h2, want)
	_, err := invoke(withKey(ctx, key), cc, "Transfer", request("b", codes.OK))
	if info := wantAnswer(t, "mismatch", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_BODY_MISMATCH", 0); info.GetMetadata()["expires_at"] != want {
		t.Fatalf("mismatch: ErrorInfo metadata %v, want expires_at %s", info.GetMetadata(), want)
	}

	failed := uuid.NewString()
	var h3 metadata.MD
	if _, err := invoke(withKey(ctx, failed), cc, "Transfer", request("a", codes.Internal), grpc.Header(&h3)); err == nil {
		t.Fatal("the handler's Internal was not returned")
	}
	header("the handler's error", h3, expiresOf(failed))
	_, err = invoke(withKey(ctx, failed), cc, "Transfer", request("a", codes.Internal))
	if info := wantAnswer(t, "previous failed", err, codes.FailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED", 0); info.GetMetadata()["expires_at"] != expiresOf(failed) {
		t.Fatalf("previous failed: ErrorInfo metadata %v, want expires_at", info.GetMetadata())
	}

	_, err = invoke(withKey(ctx, "short"), cc, "Transfer", request("a", codes.OK))
	if info := wantAnswer(t, "short key", err, codes.InvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0); info.GetMetadata()["expires_at"] != "" {
		t.Fatalf("a bad key read no row, yet ErrorInfo says %v", info.GetMetadata())
	}
	if _, err := idemgrpc.UnaryServerInterceptor(mw, map[string]idemgrpc.Method{svc + "Other": {ReplayMetadata: []string{"Idempotency-Expires"}}}); err == nil {
		t.Fatal("a method may store idempotency-expires, which names the row of each answer")
	}
}
