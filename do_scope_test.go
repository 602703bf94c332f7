package idempotency_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
)

// claimCounter is a memory store that counts its claims.
type claimCounter struct {
	*idempotency.MemoryStore
	claims atomic.Int64
}

func (s *claimCounter) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	return s.MemoryStore.Claim(ctx, req)
}

// TestOneKeySpaceUnscopedShortKeys: two clients of an unscoped Operation
// both send the key "1". Each must get its own execution: the short
// unscoped key space is refused when the Operation is built, never
// answered with the first client's record.
func TestOneKeySpaceUnscopedShortKeys(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	op, err := mw.Operation("settle", idempotency.RouteConfig{})
	if err != nil {
		for _, field := range []string{"RouteConfig.Scoped", "RouteConfig.MinKeyLength"} {
			if !strings.Contains(err.Error(), field) {
				t.Errorf("the refusal does not name %s: %v", field, err)
			}
		}
		return
	}
	for _, client := range []string{"alice", "bob"} {
		got, info, err := idempotency.Do(t.Context(), op, idempotency.Call{Key: "1", Request: []byte(`{}`)},
			func(context.Context) (string, error) { return client, nil })
		if err != nil || got != client {
			t.Fatalf("%s with key \"1\": got %q (%+v, %v): another client's answer, its own call never ran", client, got, info, err)
		}
	}
}

// TestOperationKeySpaceRules: what construction accepts, for Do and the
// adapters' Operations.
func TestOperationKeySpaceRules(t *testing.T) {
	t.Parallel()
	unscoped, _ := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry()})
	scoped, _ := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Registerer: prometheus.NewRegistry(),
		Scope: func(context.Context) string { return "u" }})
	for _, c := range []struct {
		mw   *idempotency.Middleware
		name string
		rc   idempotency.RouteConfig
		want string // "" accepted, else a part of the error
	}{
		{unscoped, "settle", idempotency.RouteConfig{}, "RouteConfig.Scoped"},
		{unscoped, "settle", idempotency.RouteConfig{MinKeyLength: 15}, "RouteConfig.MinKeyLength"},
		{unscoped, "settle", idempotency.RouteConfig{MinKeyLength: 16}, ""},
		{unscoped, "settle", idempotency.RouteConfig{Scoped: true}, ""}, // Call.Scope
		{scoped, "settle", idempotency.RouteConfig{}, "RouteConfig.Scoped"},
		{unscoped, "grpc:/pkg.S/M", idempotency.RouteConfig{}, "RouteConfig.Scoped"},
		{unscoped, "grpc:/pkg.S/M", idempotency.RouteConfig{Scoped: true}, "Config.Scope"},
		{unscoped, "connect:/pkg.S/M", idempotency.RouteConfig{Scoped: true}, "Config.Scope"},
		{scoped, "connect:/pkg.S/M", idempotency.RouteConfig{Scoped: true}, ""},
		{unscoped, "grpc:/pkg.S/M", idempotency.RouteConfig{MinKeyLength: 36}, ""},
	} {
		_, err := c.mw.Operation(c.name, c.rc)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %+v: refused: %v", c.name, c.rc, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %+v: got %v, want an error naming %s", c.name, c.rc, err, c.want)
		}
	}
}

// TestScopedOperationEmptyScope: on a Scoped Operation a call whose scope
// is empty (no Call.Scope, Config.Scope answering "") is refused with
// ErrInvalidScope before any store call; a UUID key on an unscoped
// Operation with the minimum still runs.
func TestScopedOperationEmptyScope(t *testing.T) {
	t.Parallel()
	store := &claimCounter{MemoryStore: idempotency.NewMemoryStore()}
	mw, err := idempotency.New(store, idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet,
		Scope: func(ctx context.Context) string { u, _ := ctx.Value(userKey{}).(string); return u }})
	if err != nil {
		t.Fatal(err)
	}
	op, err := mw.Operation("settle", idempotency.RouteConfig{Scoped: true})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, _, err = idempotency.Do(t.Context(), op, idempotency.Call{Key: "1"}, func(context.Context) (int, error) { ran = true; return 1, nil })
	wantAnswer(t, "scoped, no scope", err, idempotency.ErrInvalidScope, 400)
	if ran || store.claims.Load() != 0 {
		t.Fatalf("an unscoped call on a Scoped Operation ran (%v) or reached the store (%d claims)", ran, store.claims.Load())
	}
	for _, c := range []struct {
		ctx  context.Context
		call idempotency.Call
	}{
		{t.Context(), idempotency.Call{Key: "1", Scope: "alice"}},
		{context.WithValue(t.Context(), userKey{}, "bob"), idempotency.Call{Key: "1"}},
	} {
		if _, info, err := idempotency.Do(c.ctx, op, c.call, func(context.Context) (int, error) { return 1, nil }); err != nil || info.Replayed {
			t.Fatalf("%+v: %+v %v, want its own run", c.call, info, err)
		}
	}
	long, err := mw.Operation("settle-long", idempotency.RouteConfig{MinKeyLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := idempotency.Do(t.Context(), long, idempotency.Call{Key: uuid.NewString()}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("a UUID key on an unscoped Operation: %v", err)
	}
	_, _, err = idempotency.Do(t.Context(), long, idempotency.Call{Key: "short"}, func(context.Context) (int, error) { return 1, nil })
	wantAnswer(t, "a short key on the unscoped Operation", err, idempotency.ErrInvalidKey, 400)
}

// userKey carries the test's user in a context.
type userKey struct{}

// TestExecReplaysTheBytesRecorded: an Operation's replay (what gRPC and
// Connect answer, and what Do decodes) is the body recorded, byte for
// byte, on every store: white space, member order and escapes kept, and
// no marker.
func TestExecReplaysTheBytesRecorded(t *testing.T) {
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
		for _, body := range []string{" {\"z\" : \"<&>\",\n\"a\":\"\\u003c\"}\n", "{\"idempotency_replayed\":1}\n", "[1, 2]\n"} {
			key := uuid.NewString()
			exec := func() (idempotency.Response, idempotency.CallInfo, error) {
				return op.Exec(t.Context(), idempotency.Call{Key: key}, func(context.Context) idempotency.Response {
					return idempotency.Response{Status: 200, Body: []byte(body), BodyKind: idempotency.BodyJSON}
				})
			}
			if _, _, err := exec(); err != nil {
				t.Fatal(err)
			}
			resp, info, err := exec()
			if err != nil || !info.Replayed || string(resp.Body) != body {
				t.Fatalf("replay of %q: %q (%+v, %v), want the bytes recorded", body, resp.Body, info, err)
			}
		}
	})
}
