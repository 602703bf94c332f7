package idempotency

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"
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

// KeyFromContext returns the request's normalised idempotency key inside a
// wrapped handler, for example to forward it to a broker as its client
// order id. It reports false when the request carried no key or the
// kill-switch was off.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey).(string)
	return k, ok
}

// TxFromContext returns the transaction a transactional route began for its
// handler. Write through it: the writes commit together with the key's
// completed record, or not at all. The middleware owns it: its Commit and
// Rollback return ErrTxManaged and change nothing (answer >= 500 to roll
// back); Begin opens a savepoint as usual. Each call runs exactly one
// statement (several in one string fail with 42601; a batch runs one
// statement at a time), and once the transaction has ended under the
// handler every call returns ErrTxEnded and sends nothing. It reports
// false outside a transactional route.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txCtxKey).(pgx.Tx)
	return tx, ok
}

// ErrTxManaged is returned by Commit and Rollback on the transaction
// TxFromContext hands a handler: the middleware commits the handler's
// writes together with the key's record, or rolls them back, keeping the
// key's claim, when the handler failed.
var ErrTxManaged = errors.New("idempotency: the route's transaction is committed or rolled back by the middleware")
