//go:build matrix

package matrix

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
)

// serveConnect serves h as a unary procedure behind contrib/connect's
// interceptor on a loopback server; the caller sends the key as the
// Idempotency-Key header.
func serveConnect(e *env, rc idempotency.RouteConfig, h behaviour) (caller, error) {
	ic, err := idemconnect.NewInterceptor(e.mw, map[string]idemconnect.Method{rpcMethod: {Route: rc, RequireKey: rc.Transactional}})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(rpcMethod, connect.NewUnaryHandler(rpcMethod,
		func(ctx context.Context, req *connect.Request[wrapperspb.BytesValue]) (*connect.Response[wrapperspb.BytesValue], error) {
			status, out := h(ctx, &hctx{key: req.Header().Get(idemconnect.KeyHeader), body: req.Msg.GetValue()})
			if status == statusUnsettled {
				return nil, idemconnect.Unsettled("handler: the venue's outcome is unknown")
			}
			if status >= 300 {
				code := connect.CodeInternal
				if status == 503 {
					code = connect.CodeUnavailable
				}
				return nil, connect.NewError(code, errors.New("handler: "+string(out)))
			}
			return connect.NewResponse(wrapperspb.Bytes(out)), nil
		}, connect.WithInterceptors(ic)))
	srv := httptest.NewServer(scopeHTTP(mux))
	e.t.Cleanup(srv.Close)
	e.addr = srv.Listener.Addr().String()
	return connectClient(e, e.addr), nil
}

// connectClient calls the procedure on the server at addr (Connect's
// protocol over HTTP/1.1).
func connectClient(e *env, addr string) caller {
	hc := &http.Client{Transport: &http.Transport{}}
	e.t.Cleanup(hc.CloseIdleConnections)
	client := connect.NewClient[wrapperspb.BytesValue, wrapperspb.BytesValue](hc, "http://"+addr+rpcMethod)
	return func(ctx context.Context, key string, body []byte) answer {
		req := connect.NewRequest(wrapperspb.Bytes(body))
		if key != "" {
			req.Header().Set(idemconnect.KeyHeader, key)
		}
		if s := scopeOf(ctx); s != "" {
			req.Header().Set(scopeHeader, s)
		}
		resp, err := client.CallUnary(ctx, req)
		if err == nil {
			return answer{handler: true, status: 201, body: resp.Msg.GetValue(), replayed: resp.Header().Get(idemconnect.ReplayedHeader) == "true",
				expires: rfc3339Expiry(resp.Header().Get(idemconnect.ExpiresHeader))}
		}
		return connectAnswer(err)
	}
}

// connectAnswer reads a Connect error as rpcAnswer reads a gRPC status.
func connectAnswer(err error) answer {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return answer{err: err}
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == idemconnect.Domain {
				return answer{code: strings.ToLower(info.GetReason()), expires: rfc3339Expiry(info.GetMetadata()["expires_at"])}
			}
		}
	}
	switch ce.Code() {
	case connect.CodeInternal:
		return answer{handler: true, status: 500, body: []byte(ce.Message())}
	case connect.CodeUnavailable:
		if strings.HasPrefix(ce.Message(), "handler") {
			return answer{handler: true, status: 503, body: []byte(ce.Message())}
		}
	}
	return answer{err: err}
}
