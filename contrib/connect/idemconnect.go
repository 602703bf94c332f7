// Package idemconnect makes unary Connect methods safe to retry, over the
// engine of github.com/idemkit/idempotency: an interceptor that runs each
// method at most once per Idempotency-Key and replays its answer, over the
// Connect, gRPC and gRPC-Web protocols alike.
//
// The key comes from the Idempotency-Key header (gRPC metadata
// idempotency-key), or with Method.Key from a request field. The request
// hash covers the procedure and the request's deterministic encoding, the
// stored answer is the response message's bytes and full name (endpoint
// connect:/pkg.Service/Method), and the codes and answers are those of
// contrib/grpc, as connect.Code (README "Connect").
//
// A replay answers connect.NewResponse of a message of the stored type
// from protoregistry.GlobalTypes, wrapped: interceptors outside this one
// must not assert the generated response type (*connect.Response[pb.X]),
// and codecs that need a generated type's own methods are not supported on
// replays. Streaming RPCs and client-side calls pass through.
package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/protobuf/proto"
)

// KeyHeader is the request header that carries the idempotency key.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header set to "true" on a replay.
const ReplayedHeader = "Idempotent-Replayed"

// ExpiresHeader is the response header (gRPC metadata idempotency-expires)
// of the key's expiry on the handler's answer and on a replay: RFC 3339
// UTC, whole seconds (idemrpc.FormatExpires). The contract's error answers
// carry it as ErrorInfo metadata "expires_at".
const ExpiresHeader = "Idempotency-Expires"

// Method is the policy of one unary procedure.
type Method struct {
	// Route is the engine's policy: FailOpen, Transactional, TTL,
	// MinKeyLength, Scoped, MaxResponseBytes, NoStore, TxLockWait,
	// ReleaseOnError. Keys follow the opaque-key rules (1 to 255 visible
	// ASCII characters). A method is Scoped (Config.Scope names the caller;
	// a call it answers "" for is InvalidArgument IDEMPOTENCY_SCOPE_INVALID)
	// or has a MinKeyLength of at least 16 (UUID keys), or the interceptor
	// is not built. The method follows the kill-switch (Config.Enabled)
	// whatever FollowKillSwitch says.
	Route idempotency.RouteConfig
	// RequireKey answers InvalidArgument IDEMPOTENCY_KEY_REQUIRED to a call
	// without a key. Defaults to false: such calls pass through, without a
	// claim. A Transactional method must require its key.
	RequireKey bool
	// Key, when set, reads the key from the request message (an AIP-155
	// request_id field) instead of the header; "" means no key.
	Key func(req any) string
	// ReplayHeaders lists the response headers and trailers recorded with
	// the answer and replayed. No other metadata is stored; grpc-*,
	// connect-*, authorization, cookies and the HTTP never-stored headers
	// are refused.
	ReplayHeaders []string
}

// method is a Method ready to serve.
type method struct {
	op         *idempotency.Operation
	requireKey bool
	key        func(req any) string
	replay     []string
}

// interceptor applies the methods; see NewInterceptor.
type interceptor struct{ methods map[string]*method }

// NewInterceptor returns the interceptor that applies methods (by
// procedure, "/pkg.Service/Method") through mw on the handler side;
// unlisted procedures pass through. It fails when a method's name or
// policy is invalid.
func NewInterceptor(mw *idempotency.Middleware, methods map[string]Method) (connect.Interceptor, error) {
	ms := make(map[string]*method, len(methods))
	for name, m := range methods {
		if strings.Count(name, "/") != 2 || !strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") {
			return nil, fmt.Errorf("idemconnect: %q is not a procedure (/pkg.Service/Method)", name)
		}
		if m.Route.Transactional && !m.RequireKey {
			return nil, fmt.Errorf("idemconnect: %s: a Transactional method must require its key (RequireKey), or a keyless call would run without its transaction", name)
		}
		allow, err := allowList(m.ReplayHeaders)
		if err != nil {
			return nil, fmt.Errorf("idemconnect: %s: %w", name, err)
		}
		op, err := mw.Operation("connect:"+name, m.Route)
		if err != nil {
			return nil, fmt.Errorf("idemconnect: %s: %w", name, err)
		}
		ms[name] = &method{op: op, requireKey: m.RequireKey, key: m.Key, replay: allow}
	}
	return interceptor{ms}, nil
}

func (ic interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		m := ic.methods[req.Spec().Procedure]
		if m == nil || req.Spec().IsClient {
			return next(ctx, req)
		}
		return m.serve(ctx, req, next)
	}
}

func (interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// serve runs one call of m through the engine.
func (m *method) serve(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	key := m.keyOf(req)
	if key == "" && !m.requireKey {
		return next(ctx, req)
	}
	msg, ok := req.Any().(proto.Message)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: the request is not a protobuf message"))
	}
	body, err := idemrpc.RequestBytes(msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: the request does not encode: %w", err))
	}
	var (
		ran    bool
		out    connect.AnyResponse
		outErr error
	)
	resp, info, err := m.op.Exec(ctx, idempotency.Call{Key: key, Request: body}, func(hctx context.Context) idempotency.Response {
		ran = true
		out, outErr = next(hctx, req)
		return record(out, outErr, m.replay)
	})
	expires := idemrpc.FormatExpires(info.Expires)
	switch {
	case err != nil:
		return nil, answerError(err)
	case ran:
		advertise(out, outErr, expires)
		return out, outErr
	}
	return replay(resp, expires) // neither an answer nor a run: the stored answer
}

// keyOf is the call's key: the request field's, or the header's. An empty
// header, or two, are a malformed key (a control character, which the
// engine refuses and counts as invalid_key).
func (m *method) keyOf(req connect.AnyRequest) string {
	if m.key != nil {
		return m.key(req.Any())
	}
	vs := req.Header().Values(KeyHeader)
	switch {
	case len(vs) == 0:
		return ""
	case len(vs) == 1 && vs[0] != "":
		return vs[0]
	}
	return "\n"
}

// neverStored are headers no allow-list may name: credentials, the
// protocols' own, and HTTP's hop-by-hop and never-stored headers.
var neverStored = map[string]bool{
	"authorization": true, "cookie": true, "set-cookie": true, "www-authenticate": true,
	"connection": true, "keep-alive": true, "te": true, "trailer": true, "transfer-encoding": true,
	"upgrade": true, "date": true, "content-length": true, "content-type": true, "content-encoding": true,
	"user-agent": true, "idempotency-key": true, "idempotent-replayed": true, "idempotency-expires": true,
}

// allowList validates a method's ReplayHeaders, lower-cased.
func allowList(keys []string) ([]string, error) {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		k = strings.ToLower(k)
		if k == "" || neverStored[k] || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, "connect-") ||
			strings.HasPrefix(k, "proxy-") || strings.HasPrefix(k, ":") || strings.HasSuffix(k, "-bin") {
			return nil, errors.New("ReplayHeaders may not name grpc-*, connect-*, binary, reserved, credential or hop-by-hop headers")
		}
		out = append(out, http.CanonicalHeaderKey(k))
	}
	return out, nil
}
