// Package operator carries what the operator CLI (cmd/idempotency) reads
// and changes in a store's table beyond idempotency.Store: the rows of one
// key, the release of one stuck key, and the table's counts. The stores of
// this module register their methods here when the root package is
// loaded, so the root exports no name that only the CLI needs, and a store
// that is not registered simply has no operator access.
//
// The root package imports this one, so this one cannot name the root's
// types: R and F stand for idempotency.Record and idempotency.Fence.
package operator

import (
	"context"
	"sync"
	"time"
)

// Store is one store's operator methods. Every method honours ctx's
// deadline; its errors are the store's *idempotency.StoreError.
type Store[R, F any] struct {
	// Lookup returns the rows of key in scope, one per endpoint, ordered by
	// endpoint (on endpoint alone when it is not ""), with Expired and
	// LeaseOver computed by the store's clock, and that clock's time. The
	// key is compared exactly. Read-only; an unknown key is no error.
	Lookup func(ctx context.Context, key, scope, endpoint string) ([]R, time.Time, error)
	// ReleaseKey deletes the row f only if it still has f's attempt and is
	// failed, or in_flight with its lease over by the store's clock, and
	// reports whether it deleted it. A row completed, live, taken over or
	// gone since it was read is left alone (false, nil).
	ReleaseKey func(ctx context.Context, f F) (bool, error)
	// Stats counts the table's rows in one read.
	Stats func(ctx context.Context) (Stats, error)
	// CountCleanup counts the rows Store.Cleanup would delete now; it
	// deletes nothing.
	CountCleanup func(ctx context.Context) (int64, error)
}

// Stats counts the rows of the table in one read; ages are measured
// against the database's clock.
type Stats struct {
	Total, InFlight, Completed, Failed int64
	// OldestInFlightAge is how long ago the oldest in_flight row was
	// claimed (its locked_at); 0 when InFlight is 0.
	OldestInFlightAge time.Duration
	// InFlightPastLease counts in_flight rows whose lease is over (stale:
	// the outcome is unknown).
	InFlightPastLease int64
	// AwaitingCleanup counts the rows Cleanup would delete now.
	AwaitingCleanup int64
	// OldestExpiredAge is how long the oldest of them has been expired;
	// 0 when AwaitingCleanup is 0.
	OldestExpiredAge time.Duration
}

var (
	mu        sync.RWMutex
	resolvers []func(store any) (any, bool)
)

// Register adds a resolver: given a store, it returns that store's
// Store[R, F] and true, or false for a store it does not know.
func Register(resolve func(store any) (any, bool)) {
	mu.Lock()
	defer mu.Unlock()
	resolvers = append(resolvers, resolve)
}

// For returns store's operator methods, and false when no registered
// resolver knows the store (or knows it under other types).
func For[R, F any](store any) (Store[R, F], bool) {
	mu.RLock()
	rs := resolvers // appended only: a wrapper's resolver may call For itself
	mu.RUnlock()
	for _, resolve := range rs {
		if m, ok := resolve(store); ok {
			s, ok := m.(Store[R, F])
			return s, ok
		}
	}
	return Store[R, F]{}, false
}
