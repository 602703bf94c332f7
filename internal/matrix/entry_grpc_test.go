//go:build matrix

package matrix

import (
	"context"
	"net"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
)

// rpcMethod is the one method the gRPC and Connect servers serve.
const rpcMethod = "/matrix.Orders/Place"

// serveGRPC serves h as a unary method behind contrib/grpc's interceptor
// on a loopback server; the caller sends the key as metadata.
func serveGRPC(e *env, rc idempotency.RouteConfig, h behaviour) (caller, error) {
	ic, err := idemgrpc.UnaryServerInterceptor(e.mw, map[string]idemgrpc.Method{rpcMethod: {Route: rc, RequireKey: rc.Transactional}})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(scopeGRPC, ic))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "matrix.Orders", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Place", Handler: func(srvi any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(testpb.SimpleRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) {
				key := ""
				if vs := metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey); len(vs) == 1 {
					key = vs[0]
				}
				status, out := h(ctx, &hctx{key: key, body: req.(*testpb.SimpleRequest).GetPayload().GetBody()})
				if err := rpcHandlerError(status, out); err != nil {
					return nil, err
				}
				return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: out}}, nil
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srvi, FullMethod: rpcMethod}, run)
		}}}}, nil)
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(srv.Stop)
	e.addr = ln.Addr().String()
	return grpcClient(e, e.addr), nil
}

// grpcClient calls the method on the server at addr.
func grpcClient(e *env, addr string) caller {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cc.Close() })
	return func(ctx context.Context, key string, body []byte) answer {
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
		}
		if s := scopeOf(ctx); s != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, scopeHeader, s)
		}
		var hdr metadata.MD
		out := new(testpb.SimpleResponse)
		err := cc.Invoke(ctx, rpcMethod, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}}, out, grpc.Header(&hdr))
		a := rpcAnswer(status.Convert(err), idemgrpc.Domain)
		if err == nil {
			a.body = out.GetPayload().GetBody()
		}
		a.replayed = len(hdr.Get(idemgrpc.ReplayedKey)) == 1 && hdr.Get(idemgrpc.ReplayedKey)[0] == "true"
		if vs := hdr.Get(idemgrpc.ExpiresKey); a.handler && len(vs) == 1 {
			a.expires = rfc3339Expiry(vs[0])
		}
		return a
	}
}

// rpcHandlerError is a behaviour's non-2xx status as an RPC status: 5xx
// Internal (503: Unavailable), other codes FailedPrecondition.
func rpcHandlerError(st int, body []byte) error {
	switch {
	case st < 300:
		return nil
	case st == statusUnsettled:
		return idemgrpc.Unsettled("handler: the venue's outcome is unknown")
	case st == 503:
		return status.Error(codes.Unavailable, "handler: "+string(body))
	case st >= 500:
		return status.Error(codes.Internal, "handler: "+string(body))
	}
	return status.Error(codes.FailedPrecondition, "handler: "+string(body))
}

// rpcAnswer reads an RPC status: one with the engine's ErrorInfo is the
// contract's answer (its reason in lower case); a transport failure
// (deadline, unavailable without details) is no answer; others are the
// handler's.
func rpcAnswer(st *status.Status, domain string) answer {
	if st.Code() == codes.OK {
		return answer{handler: true, status: 201}
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == domain {
			return answer{code: strings.ToLower(info.GetReason()), expires: rfc3339Expiry(info.GetMetadata()["expires_at"])}
		}
	}
	switch st.Code() {
	case codes.Internal:
		return answer{handler: true, status: 500, body: []byte(st.Message())}
	case codes.FailedPrecondition:
		return answer{handler: true, status: 409, body: []byte(st.Message())}
	case codes.Unavailable:
		if strings.Contains(st.Message(), "handler") {
			return answer{handler: true, status: 503, body: []byte(st.Message())}
		}
	}
	return answer{err: st.Err()}
}
