package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

// userOf is the test's Config.Scope: the call's "x-user" metadata.
func userOf(ctx context.Context) string {
	if vs := metadata.ValueFromIncomingContext(ctx, "x-user"); len(vs) == 1 {
		return vs[0]
	}
	return ""
}

// TestOneKeySpace: two clients of an unscoped method both send the key
// "1"; each must get its own execution. An unscoped method with short
// keys is refused when the interceptor is built, never answered with the
// other client's stored response.
func TestOneKeySpace(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t, idempotency.NewMemoryStore(), idempotency.Config{})
	_, err := idemgrpc.UnaryServerInterceptor(mw, map[string]idemgrpc.Method{svc + "Transfer": {RequireKey: true}})
	if err != nil {
		for _, field := range []string{svc + "Transfer", "RouteConfig.Scoped", "RouteConfig.MinKeyLength"} {
			if !strings.Contains(err.Error(), field) {
				t.Errorf("the refusal does not name %s: %v", field, err)
			}
		}
		return
	}
	var r runs
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return answer(req, r.note(ctx))
	}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{svc + "Transfer": {RequireKey: true}}, h, "Transfer"))
	for _, client := range []string{"alice", "bob"} {
		var header metadata.MD
		if _, err := invoke(withKey(t.Context(), "1"), cc, "Transfer", request(client, codes.OK), grpc.Header(&header)); err != nil || replayed(header) {
			t.Fatalf("%s with key \"1\": %v, replayed %v: another client's answer, its own call never ran", client, err, replayed(header))
		}
	}
}

// TestScopedMethod: on a Scoped method, a call whose Config.Scope answer
// is empty is InvalidArgument IDEMPOTENCY_SCOPE_INVALID and never runs;
// two users' short keys never meet.
func TestScopedMethod(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t, idempotency.NewMemoryStore(), idempotency.Config{Scope: userOf})
	var r runs
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return answer(req, r.note(ctx))
	}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{
		svc + "Transfer": {RequireKey: true, Route: idempotency.RouteConfig{Scoped: true}}}, h, "Transfer"))
	_, err := invoke(withKey(t.Context(), "1"), cc, "Transfer", request("x", codes.OK))
	wantAnswer(t, "no scope", err, codes.InvalidArgument, "IDEMPOTENCY_SCOPE_INVALID", 0)
	if r.count("1") != 0 {
		t.Fatal("a call without a scope ran")
	}
	for _, user := range []string{"alice", "bob"} {
		var header metadata.MD
		ctx := metadata.AppendToOutgoingContext(withKey(t.Context(), "1"), "x-user", user)
		if _, err := invoke(ctx, cc, "Transfer", request(user, codes.OK), grpc.Header(&header)); err != nil || replayed(header) {
			t.Fatalf("%s: %v, replayed %v; want its own run", user, err, replayed(header))
		}
	}
	if _, err := idemgrpc.UnaryServerInterceptor(mw, map[string]idemgrpc.Method{svc + "X": {}}); err == nil {
		t.Error("an unscoped method with short keys was built")
	}
	unscoped, _ := newMiddleware(t, idempotency.NewMemoryStore(), idempotency.Config{})
	if _, err := idemgrpc.UnaryServerInterceptor(unscoped, map[string]idemgrpc.Method{svc + "X": {Route: idempotency.RouteConfig{Scoped: true}}}); err == nil {
		t.Error("a Scoped method without Config.Scope was built: every call would be refused")
	}
}
