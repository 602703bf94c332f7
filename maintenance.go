package idempotency

import (
	"cmp"
	"context"
	"time"
)

// Maintenance of a Store, shared by the Middleware (Cleanup, Erase,
// RunJanitor), the example server and the operator CLI.

// DefaultCleanupBatch is how many rows one cleanup batch deletes at most,
// unless told otherwise.
const DefaultCleanupBatch = 1000

// CleanupOptions configures Cleanup.
type CleanupOptions struct {
	// Batch is the most rows one store call deletes. Defaults to
	// DefaultCleanupBatch.
	Batch int
	// Timeout bounds each batch's store call, together with the caller's
	// context. Defaults to DefaultStoreTimeout.
	Timeout time.Duration
	// Progress, when set, is called after each batch with the rows deleted
	// and the batches run so far. Defaults to nil.
	Progress func(deleted, batches int64)
}

// Cleanup deletes the expired rows of store, batch after batch, until a
// batch comes back short or ctx ends, and returns how many rows it deleted.
// In-flight rows whose lease still runs are never deleted.
func Cleanup(ctx context.Context, store Store, opts CleanupOptions) (int64, error) {
	timeout := cmp.Or(opts.Timeout, DefaultStoreTimeout)
	return cleanup(ctx, opts, func(ctx context.Context, batch int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return store.Cleanup(ctx, batch)
	})
}

// cleanup is Cleanup's loop over one batch call.
func cleanup(ctx context.Context, opts CleanupOptions, call func(context.Context, int) (int64, error)) (int64, error) {
	batch := opts.Batch
	if batch <= 0 {
		batch = DefaultCleanupBatch
	}
	var total, batches int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := call(ctx, batch)
		total += n
		batches++
		if err != nil {
			return total, err
		}
		if opts.Progress != nil {
			opts.Progress(total, batches)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// Erase deletes every row of a user scope of store except in_flight rows
// still inside their lease, which it returns (the GDPR erasure step), under
// ctx and timeout (DefaultStoreTimeout when 0), whichever ends first. A key
// retried after erasure is new.
func Erase(ctx context.Context, store Store, scope string, timeout time.Duration) (ErasureResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultStoreTimeout))
	defer cancel()
	return store.Erase(ctx, scope)
}

// Cleanup deletes expired rows in batches of batch rows (1000 when batch <=
// 0), each under ctx and the store timeout, until a batch comes back short
// or ctx ends. It returns how many rows it deleted. In-flight rows whose
// lease still runs are never deleted.
func (m *Middleware) Cleanup(ctx context.Context, batch int) (int64, error) {
	return cleanup(ctx, CleanupOptions{Batch: batch}, func(ctx context.Context, batch int) (int64, error) {
		n, err := timedCall(m, ctx, "cleanup", func(c context.Context) (int64, error) {
			return m.store.Cleanup(c, batch)
		})
		m.metrics.cleanupDeleted.Add(float64(n))
		return n, err
	})
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
