package idemconnect_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"google.golang.org/protobuf/types/known/structpb"
)

// A Connect handler that runs at most once per Idempotency-Key, called
// twice with one key over the gRPC protocol.
func Example() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		Enabled: func(context.Context) bool { return true }, // the kill-switch: FLAG_IDEMPOTENCY_MIDDLEWARE by default
	})
	if err != nil {
		panic(err)
	}
	const procedure = "/payments.v1.Payments/Transfer"
	ic, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{
		// Unscoped, so keys of at least 16 bytes (a UUID); with Config.Scope
		// returning the caller's user, Route: {Scoped: true} takes short keys.
		// Add Transactional: true on PostgreSQL.
		procedure: {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16}},
	})
	if err != nil {
		panic(err)
	}
	runs := 0
	transfer := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		runs++
		return connect.NewResponse(must(structpb.NewStruct(map[string]any{"transfer": runs}))), nil
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, transfer, connect.WithInterceptors(ic)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	client := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+procedure, connect.WithGRPC())
	for range 2 {
		req := connect.NewRequest(must(structpb.NewStruct(map[string]any{"amount": 10})))
		req.Header().Set(idemconnect.KeyHeader, "payment-7f3a-41c2-9e0b")
		resp, err := client.CallUnary(context.Background(), req)
		fmt.Printf("transfer #%v %v replayed=%q\n", resp.Msg.GetFields()["transfer"].GetNumberValue(), err, resp.Header().Get(idemconnect.ReplayedHeader))
	}
	// Output:
	// transfer #1 <nil> replayed=""
	// transfer #1 <nil> replayed="true"
}
