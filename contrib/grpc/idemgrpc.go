// Package idemgrpc makes unary gRPC methods safe to retry, over the engine
// of github.com/idemkit/idempotency: a server interceptor that runs each
// method at most once per idempotency key and replays its answer, and a
// client interceptor that keeps one key per logical call across its
// retries.
//
// The server takes the key from the metadata "idempotency-key" (or, with
// Method.Key, from a request field, AIP-155 style), hashes the full method
// name and the request's deterministic encoding, and stores the response
// message's bytes and full name under the endpoint grpc:/pkg.Service/Method.
// The handler's code decides the outcome as an HTTP status does: OK and the
// deterministic codes complete and replay (code, message, details),
// ResourceExhausted releases the key, every other code fails it. A replay
// carries the header metadata "idempotent-replayed: true". The contract's
// other answers are gRPC statuses with an ErrorInfo (domain Domain) and,
// where a retry is invited, a RetryInfo (README "gRPC").
//
// Streaming RPCs are not intercepted: there is no stream interceptor, so
// they pass through untouched. Methods not listed pass through too.
package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MetadataKey is the metadata key that carries the idempotency key.
const MetadataKey = "idempotency-key"

// ReplayedKey is the header metadata key set to "true" on a replay.
const ReplayedKey = "idempotent-replayed"

// ExpiresKey is the header metadata key of the key's expiry on the
// handler's answer and on a replay: RFC 3339 UTC, whole seconds
// (idemrpc.FormatExpires). The contract's error answers carry it as
// ErrorInfo metadata "expires_at".
const ExpiresKey = idemrpc.ExpiresKey

// Method is the policy of one unary method.
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
	// Key, when set, reads the key from the request (an AIP-155 request_id
	// field) instead of the metadata; "" means no key.
	Key func(req any) string
	// ReplayMetadata lists the header and trailer metadata keys recorded
	// with the response and replayed. No other metadata is stored; keys
	// ending in -bin, grpc-*, authorization, cookies and the HTTP
	// never-stored headers are refused.
	ReplayMetadata []string
}

// method is a Method ready to serve.
type method struct {
	op         *idempotency.Operation
	requireKey bool
	key        func(req any) string
	replay     []string // lower-case metadata keys
}

// UnaryServerInterceptor returns the interceptor that applies methods (by
// full method name, "/pkg.Service/Method") through mw; unlisted methods
// pass through. It fails when a method's name or policy is invalid.
func UnaryServerInterceptor(mw *idempotency.Middleware, methods map[string]Method) (grpc.UnaryServerInterceptor, error) {
	ms := make(map[string]*method, len(methods))
	for name, m := range methods {
		if strings.Count(name, "/") != 2 || !strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") {
			return nil, fmt.Errorf("idemgrpc: %q is not a full method name (/pkg.Service/Method)", name)
		}
		if m.Route.Transactional && !m.RequireKey {
			return nil, fmt.Errorf("idemgrpc: %s: a Transactional method must require its key (RequireKey), or a keyless call would run without its transaction", name)
		}
		allow, err := allowList(m.ReplayMetadata)
		if err != nil {
			return nil, fmt.Errorf("idemgrpc: %s: %w", name, err)
		}
		op, err := mw.Operation("grpc:"+name, m.Route)
		if err != nil {
			return nil, fmt.Errorf("idemgrpc: %s: %w", name, err)
		}
		ms[name] = &method{op: op, requireKey: m.RequireKey, key: m.Key, replay: allow}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m := ms[info.FullMethod]
		if m == nil {
			return handler(ctx, req)
		}
		return m.serve(ctx, req, info.FullMethod, handler)
	}, nil
}

// serve runs one call of m through the engine.
func (m *method) serve(ctx context.Context, req any, fullMethod string, handler grpc.UnaryHandler) (any, error) {
	key := m.keyOf(ctx, req)
	if key == "" && !m.requireKey {
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: %s: the request is not a protobuf message", fullMethod)
	}
	body, err := idemrpc.RequestBytes(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: %s: the request does not encode: %v", fullMethod, err)
	}
	var (
		ran     bool
		out     any
		outErr  error
		capture = &captureStream{method: fullMethod}
	)
	resp, info, err := m.op.Exec(ctx, idempotency.Call{Key: key, Request: body}, func(hctx context.Context) idempotency.Response {
		ran = true
		out, outErr = handler(grpc.NewContextWithServerTransportStream(hctx, capture), req)
		return record(out, outErr, capture, m.replay)
	})
	expires := idemrpc.FormatExpires(info.Expires)
	switch {
	case err != nil:
		return nil, answerStatus(err)
	case ran:
		capture.flush(ctx, expires)
		return out, outErr
	}
	return replay(ctx, resp, expires) // neither an answer nor a run: the stored answer
}

// keyOf is the call's key: the request field's, or the metadata's. An
// empty metadata value, or two, are a malformed key (a control character, which the
// engine refuses and counts as invalid_key).
func (m *method) keyOf(ctx context.Context, req any) string {
	if m.key != nil {
		return m.key(req)
	}
	vs := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch len(vs) {
	case 0:
		return ""
	case 1:
		if vs[0] != "" {
			return vs[0]
		}
	}
	return "\n"
}

// errBadMetadata is why a ReplayMetadata key is refused.
var errBadMetadata = errors.New("ReplayMetadata may not name binary (-bin), grpc-*, reserved, credential or hop-by-hop keys")
