package idempotency

import "context"

// WithTxHooksForTest returns ctx carrying test hooks for the transaction a
// transactional route hands the handler of a request with this context:
// call runs in each call of that transaction once the call passed the
// check that the handler still runs, before it reaches the connection;
// closeWait runs when closing the transaction's view (the handler
// returned) must wait for calls under way. Either may be nil.
func WithTxHooksForTest(ctx context.Context, call, closeWait func()) context.Context {
	return context.WithValue(ctx, txHooksKey{}, &txHooks{call: call, closeWait: closeWait})
}
