package idemconnect_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// userKey carries the caller's user, as an auth middleware would.
type userKey struct{}

// serveAsUser serves procs through the interceptor of methods over mw,
// behind a middleware that puts the X-User header into the context.
func serveAsUser(t *testing.T, mw *idempotency.Middleware, methods map[string]idemconnect.Method, procs map[string]procFunc) string {
	t.Helper()
	ic, err := idemconnect.NewInterceptor(mw, methods)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for name, f := range procs {
		mux.Handle(name, connect.NewUnaryHandler(name, f, connect.WithInterceptors(ic)))
	}
	url, stop, err := listenH2C(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, r.Header.Get("X-User"))))
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// callAs calls c with key as user ("" for none).
func callAs(ctx context.Context, c stub, key, user string) (*connect.Response[structpb.Struct], error) {
	req := connect.NewRequest(&structpb.Struct{})
	req.Header().Set(idemconnect.KeyHeader, key)
	if user != "" {
		req.Header().Set("X-User", user)
	}
	return c.CallUnary(ctx, req)
}

// TestOneKeySpace: two clients of an unscoped procedure both send the key
// "1"; each must get its own execution. An unscoped procedure with short
// keys is refused when the interceptor is built, never answered with the
// other client's stored response.
func TestOneKeySpace(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]idemconnect.Method{svc + "Transfer": {RequireKey: true}}
	if _, err := idemconnect.NewInterceptor(mw, methods); err != nil {
		for _, field := range []string{svc + "Transfer", "RouteConfig.Scoped", "RouteConfig.MinKeyLength"} {
			if !strings.Contains(err.Error(), field) {
				t.Errorf("the refusal does not name %s: %v", field, err)
			}
		}
		return
	}
	r := &counter{}
	base := serveAsUser(t, mw, methods, map[string]procFunc{svc + "Transfer": counted(r)})
	c := dialProc(h2cClient(), base, svc+"Transfer", wires[0])
	for _, client := range []string{"alice", "bob"} {
		resp, err := callAs(t.Context(), c, "1", client)
		if err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" {
			t.Fatalf("%s with key \"1\": %v: another client's answer, its own call never ran", client, err)
		}
	}
}

// TestScopedProcedure: on a Scoped procedure, a call whose Config.Scope
// answer is empty is InvalidArgument IDEMPOTENCY_SCOPE_INVALID and never
// runs; two users' short keys never meet.
func TestScopedProcedure(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
		Enabled: func(context.Context) bool { return true },
		Scope:   func(ctx context.Context) string { u, _ := ctx.Value(userKey{}).(string); return u }})
	if err != nil {
		t.Fatal(err)
	}
	r := &counter{}
	base := serveAsUser(t, mw, map[string]idemconnect.Method{svc + "Transfer": {RequireKey: true, Route: idempotency.RouteConfig{Scoped: true}}},
		map[string]procFunc{svc + "Transfer": counted(r)})
	c := dialProc(h2cClient(), base, svc+"Transfer", wires[0])
	_, err = callAs(t.Context(), c, "1", "")
	wantAnswer(t, "no scope", err, connect.CodeInvalidArgument, "IDEMPOTENCY_SCOPE_INVALID", 0)
	if r.count("1") != 0 {
		t.Fatal("a call without a scope ran")
	}
	for _, user := range []string{"alice", "bob"} {
		if resp, err := callAs(t.Context(), c, "1", user); err != nil || resp.Header().Get(idemconnect.ReplayedHeader) != "" {
			t.Fatalf("%s: %v; want its own run", user, err)
		}
	}
	if r.count("1") != 2 {
		t.Fatalf("%d runs for two users, want 2", r.count("1"))
	}
	unscoped, _ := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry()})
	if _, err := idemconnect.NewInterceptor(unscoped, map[string]idemconnect.Method{svc + "X": {Route: idempotency.RouteConfig{Scoped: true}}}); err == nil {
		t.Error("a Scoped procedure without Config.Scope was built: every call would be refused")
	}
}
