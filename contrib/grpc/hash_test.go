package idemgrpc_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// hashStore records the request hash of every claim.
type hashStore struct {
	idempotency.Store
	mu     sync.Mutex
	hashes map[string]string // key -> request hash
}

func (s *hashStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.mu.Lock()
	s.hashes[req.Key] = req.RequestHash
	s.mu.Unlock()
	return s.Store.Claim(ctx, req)
}

// withUnknown returns m with an unknown field appended, as a replica that
// does not know field 99 yet keeps it.
func withUnknown[M proto.Message](m M) M {
	r := m.ProtoReflect()
	b := protowire.AppendTag(r.GetUnknown(), 99, protowire.BytesType)
	r.SetUnknown(protowire.AppendBytes(b, []byte("from a newer schema")))
	return m
}

// TestRequestHashGolden pins the request hash of a few calls (the full
// method and the deterministic encoding with unknown fields discarded at
// every level), so a protobuf-go upgrade or a change of framing that moves
// them shows up in review: a moved hash answers a retry that spans the
// deploy with InvalidArgument mismatch.
func TestRequestHashGolden(t *testing.T) {
	t.Parallel()
	store := &hashStore{Store: idempotency.NewMemoryStore(), hashes: map[string]string{}}
	mw, _ := newMiddleware(t, store, idempotency.Config{})
	h := func(_ context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return answer(req, "1")
	}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{svc + "Transfer": {}, svc + "Refund": {}}, h, "Transfer", "Refund"))
	pay := func() *testpb.SimpleRequest {
		return &testpb.SimpleRequest{ResponseSize: 10, FillUsername: true, Payload: &testpb.Payload{Body: []byte("pay 10 EUR to acct-7")}}
	}
	nestedUnknown := pay()
	withUnknown(nestedUnknown.Payload)
	withUnknown(nestedUnknown)
	for _, c := range []struct {
		name, method string
		req          *testpb.SimpleRequest
		want         string
	}{
		{"empty", "Transfer", &testpb.SimpleRequest{}, "f672934f87320ee082f7b4a1d26c9e59ba51f54bb80d272e36844cfa254f7715"},
		{"payment", "Transfer", pay(), "a9e71e6f50feb760efb428c537ff6705529274c44cb225d58120104e3d687259"},
		{"unknown fields at two levels", "Transfer", nestedUnknown, "a9e71e6f50feb760efb428c537ff6705529274c44cb225d58120104e3d687259"},
		{"another method", "Refund", pay(), "df77d8f3da2f3934a4ec5a1ebf77896a66ed5b485564d2b69ff0b7df8fc88273"},
	} {
		key := uuid.NewString()
		var hd metadata.MD
		if _, err := invoke(withKey(t.Context(), key), cc, c.method, c.req, grpc.Header(&hd)); err != nil {
			t.Fatal(err)
		}
		store.mu.Lock()
		got := store.hashes[key]
		store.mu.Unlock()
		if got != c.want {
			t.Errorf("%s: request hash %s, want %s", c.name, got, c.want)
		}
	}
}
