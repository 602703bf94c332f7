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

// Cleanup purges the responses of expired tombstones (ExpiredRefuse) and
// deletes the rows past their retention (retain_until: the expiry, or a
// tombstone's grace after it), never an in_flight row inside its lease, in
// batches of batch rows each (1000 when batch <= 0) under the store timeout,
// until a batch changes fewer than batch rows or ctx ends, and returns the
// rows it changed (purged and deleted).
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

// RunJanitor calls Cleanup every interval, logging failures, until ctx is
// done. Run it in its own goroutine.
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

// Erase deletes every row of a user scope except in_flight rows inside
// their lease, which it returns (GDPR erasure), under ctx and the store
// timeout.
func (m *Middleware) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	return timedCall(m, ctx, "erase", func(c context.Context) (ErasureResult, error) {
		return m.store.Erase(c, scope)
	})
}
