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
)

// RequestFromContext returns the HTTP request a route is deciding, inside
// Config's hooks (Scope, RouteName, Enabled, OnReplay), which take the
// call's context so that one hook serves HTTP routes and Do alike. It
// reports false for a call that did not come over HTTP.
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
