package idemconnect_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/structpb"
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

// TestRequestHashGolden pins the request hash of a few calls (the
// procedure and the deterministic encoding: map entries in key order,
// unknown fields discarded at every level), over the proto and the JSON
// codec alike, so a protobuf-go upgrade or a change of framing that moves
// them shows up in review.
func TestRequestHashGolden(t *testing.T) {
	t.Parallel()
	store := &hashStore{Store: idempotency.NewMemoryStore(), hashes: map[string]string{}}
	ts := newServer(t, store, idempotency.Config{})
	pay := map[string]any{"amount": 10, "to": "acct-7", "memo": map[string]any{"ref": "inv-1", "lines": []any{"a", "b"}}}
	unknown, err := structpb.NewStruct(pay)
	if err != nil {
		t.Fatal(err)
	}
	memo := unknown.Fields["memo"].GetStructValue().ProtoReflect()
	memo.SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte("newer schema")))
	for _, c := range []struct {
		name, codec string
		msg         *structpb.Struct
		want        string
	}{
		{"empty", "connect+proto", &structpb.Struct{}, "b036f9318e5a289c2673f7f74b4617703e1c783a7bba6eb0d95d5b863ed710dd"},
		{"payment", "connect+proto", must(structpb.NewStruct(pay)), "bf1c5ff20eb0546823b4f2dc76f5da5edded98ce911e1d70419e50e7e1726643"},
		{"payment as JSON", "connect+json", must(structpb.NewStruct(pay)), "bf1c5ff20eb0546823b4f2dc76f5da5edded98ce911e1d70419e50e7e1726643"},
		{"payment over gRPC", "grpc+proto", must(structpb.NewStruct(pay)), "bf1c5ff20eb0546823b4f2dc76f5da5edded98ce911e1d70419e50e7e1726643"},
		{"unknown field inside", "grpc+proto", unknown, "bf1c5ff20eb0546823b4f2dc76f5da5edded98ce911e1d70419e50e7e1726643"},
	} {
		key := uuid.NewString()
		req := must(structpb.NewStruct(nil))
		req.Fields = c.msg.Fields
		r := connectRequest(req, key)
		if _, err := ts.client("Transfer", protocols[c.codec]).CallUnary(t.Context(), r); err != nil {
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

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
