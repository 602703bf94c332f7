package idempotency

import (
	"context"
	"time"
)

// Maintenance of a Store through the Middleware: Cleanup, RunJanitor and
// Erase, each store call timed and counted like a request's.

// defaultCleanupBatch is how many rows one cleanup batch deletes at most
// when Cleanup is not told otherwise.
const defaultCleanupBatch = 1000

// Cleanup deletes expired rows in batches of batch rows (1000 when batch <=
// 0), each under ctx and the store timeout, until a batch comes back short
// or ctx ends. It returns how many rows it deleted. In-flight rows whose
// lease still runs are never deleted.
func (m *Middleware) Cleanup(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = defaultCleanupBatch
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := timedCall(m, ctx, "cleanup", func(c context.Context) (int64, error) {
			return m.store.Cleanup(c, batch)
		})
		m.metrics.cleanupDeleted.Add(float64(n))
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
	}
}

// RunJanitor calls Cleanup every interval until ctx is done, logging
// failures; it returns when ctx is done. Run it in its own goroutine.
func (m *Middleware) RunJanitor(ctx context.Context, interval time.Duration, batch int) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := m.Cleanup(ctx, batch)
			if err != nil && ctx.Err() == nil {
				m.log.ErrorContext(ctx, "idempotency: cleanup failed", "deleted", n, "error", err)
			}
		}
	}
}

// Erase deletes every row of a user scope except in_flight rows still inside
// their lease, which it returns (the GDPR erasure step). A key retried after
// erasure is new. It runs under ctx and the store timeout, whichever ends
// first.
func (m *Middleware) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	return timedCall(m, ctx, "erase", func(c context.Context) (ErasureResult, error) {
		return m.store.Erase(c, scope)
	})
}
