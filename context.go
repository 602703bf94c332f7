package idempotency

import (
	"context"
	"net/http"
)

type ctxKey int

const (
	keyCtxKey ctxKey = iota
	txCtxKey
	requestCtxKey
	deriveCtxKey
)

// RequestFromContext returns the HTTP request a route is deciding, for the
// hooks that take the call's context so one hook serves HTTP and Do
// (Config.Scope, Enabled, RouteName, OnReplay, Reconcile); false for a call
// not over HTTP, and in Observer, Logger and DeriveKeys, which are not
// given it.
func RequestFromContext(ctx context.Context) (*http.Request, bool) {
	r, ok := ctx.Value(requestCtxKey).(*http.Request)
	return r, ok
}

// KeyFromContext returns the request's normalised key inside a wrapped
// handler (to forward as a broker's client order id, say); false when the
// request carried no key or the kill-switch was off.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey).(string)
	return k, ok
}
