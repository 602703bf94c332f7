//go:build matrix

package matrix

import (
	"context"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A cell's caller names the user a call is about through its context
// (sendAs); each entry carries it to the server as a header or metadata,
// where the server puts it back into the call's context for Config.Scope
// (scopeOf). Do needs no carrier: Call.Scope "" asks Config.Scope with the
// caller's own context.

type scopeCtxKey struct{}

// scopeHeader carries the scope over HTTP and Connect; gRPC sends it as
// metadata under its lower-case name.
const scopeHeader = "X-Matrix-Scope"

// withScope returns ctx naming scope.
func withScope(ctx context.Context, scope string) context.Context {
	return context.WithValue(ctx, scopeCtxKey{}, scope)
}

// scopeOf is the scope ctx names, "" when none: the cells' Config.Scope.
func scopeOf(ctx context.Context) string {
	s, _ := ctx.Value(scopeCtxKey{}).(string)
	return s
}

// scopeHTTP puts a request's scope header into its context.
func scopeHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := r.Header.Get(scopeHeader); s != "" {
			r = r.WithContext(withScope(r.Context(), s))
		}
		next.ServeHTTP(w, r)
	})
}

// scopeGRPC puts a call's scope metadata into its context, ahead of the
// idempotency interceptor.
func scopeGRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if vs := metadata.ValueFromIncomingContext(ctx, scopeHeader); len(vs) == 1 {
		ctx = withScope(ctx, vs[0])
	}
	return next(ctx, req)
}

// sendAsUnrun is sendUnrun on behalf of scope: a 503 or 409 in flight
// answered before the handler started for this call is sent again, as a
// client honouring Retry-After would (the handler's runs for key in other
// scopes do not count as this call's start).
func (e *env) sendAsUnrun(scope, key string) answer {
	before := e.started(key)
	a := e.sendAs(scope, key)
	for range 3 {
		busy := a.code == "idempotency_store_unavailable" || a.code == "idempotency_in_flight"
		if !busy || e.started(key) > before {
			return a
		}
		time.Sleep(time.Second) // the contract's Retry-After: 1, not a synchronisation
		a = e.sendAs(scope, key)
	}
	return a
}
