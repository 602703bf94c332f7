package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// payments is a generated service's implementation: each UnaryCall moves
// money once.
type payments struct {
	testpb.UnimplementedTestServiceServer
	runs int
}

func (p *payments) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p.runs++
	return &testpb.SimpleResponse{ServerId: fmt.Sprint("transfer #", p.runs)}, nil
}

// A server that runs UnaryCall at most once per key, and a client whose
// retries keep one key per logical call.
func Example() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Enabled: func(context.Context) bool { return true }, // the kill-switch: FLAG_IDEMPOTENCY_MIDDLEWARE by default
	})
	if err != nil {
		panic(err)
	}
	ic, err := idemgrpc.UnaryServerInterceptor(mw, map[string]idemgrpc.Method{
		// Unscoped, so keys of at least 16 bytes (a UUID); with Config.Scope
		// returning the caller's user, Route: {Scoped: true} takes short keys.
		// Add Transactional: true on PostgreSQL.
		testpb.TestService_UnaryCall_FullMethodName: {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16}},
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic))
	testpb.RegisterTestServiceServer(srv, &payments{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{})))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	client := testpb.NewTestServiceClient(cc)
	ctx := idemgrpc.WithKey(context.Background(), "payment-7f3a-41c2-9e0b") // the same key for a call and its retries
	for range 2 {
		var header metadata.MD
		resp, err := client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 10}, grpc.Header(&header))
		fmt.Println(resp.GetServerId(), err, header.Get(idemgrpc.ReplayedKey))
	}
	// Output:
	// transfer #1 <nil> []
	// transfer #1 <nil> [true]
}
