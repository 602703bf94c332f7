package idempotency

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// KeyReleaser is implemented by stores that let an operator release one
// stuck key (the CLI's release command): a failed key, or an in_flight key
// whose lease is over, deleted so that the client's next retry executes
// again. Both stores of this package implement it; callers check with a
// type assertion, or use LookupKey and ReleaseKey.
type KeyReleaser interface {
	// Lookup returns the rows of key in scope, one per endpoint, ordered
	// by endpoint (on endpoint alone when it is not ""), with Expired and
	// LeaseOver computed by the store's clock, and that clock's time. The
	// key is compared exactly. Read-only; an unknown key is no error.
	Lookup(ctx context.Context, key, scope, endpoint string) (KeyRows, error)
	// ReleaseKey deletes the row f only if it still has f's attempt and
	// is failed, or in_flight with its lease over by the store's clock, and
	// reports whether it deleted it. A row completed, live, taken over,
	// or gone since it was read is left alone (false, nil). Its
	// errors are *StoreErrors with Op "release".
	ReleaseKey(ctx context.Context, f Fence) (bool, error)
}

// ErrNoKeyRelease is returned by LookupKey and ReleaseKey for a store
// that does not implement KeyReleaser.
var ErrNoKeyRelease = errors.New("idempotency: the store cannot release single keys (it does not implement KeyReleaser)")

// Releasable reports whether an operator may release rec: it is failed, or
// in_flight with its lease over. A completed key replays and a live one is
// running: neither is released.
func Releasable(rec Record) bool {
	return rec.Status == StatusFailed || rec.Status == StatusInFlight && rec.LeaseOver
}

// LookupKey reads the rows of key in scope (on endpoint alone when it is
// not "") through store's KeyReleaser, under ctx and timeout
// (DefaultStoreTimeout when 0).
func LookupKey(ctx context.Context, store Store, key, scope, endpoint string, timeout time.Duration) ([]Record, error) {
	kr, ok := store.(KeyReleaser)
	if !ok {
		return nil, ErrNoKeyRelease
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultStoreTimeout))
	defer cancel()
	rows, err := kr.Lookup(ctx, key, scope, endpoint)
	return rows.Records, err
}

// ReleaseKey releases the row rec (read by LookupKey) through store's
// KeyReleaser, fenced on its attempt: it deletes the row only if it is
// still as read, failed or in_flight past its lease, and reports whether it
// did. The client's next retry of the key executes again, which on an
// ordinary route may run the operation a second time: release a stale
// in_flight key only once you know its first run did nothing. It runs
// under ctx and timeout (DefaultStoreTimeout when 0).
func ReleaseKey(ctx context.Context, store Store, rec Record, timeout time.Duration) (bool, error) {
	kr, ok := store.(KeyReleaser)
	if !ok {
		return false, ErrNoKeyRelease
	}
	if !Releasable(rec) {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, DefaultStoreTimeout))
	defer cancel()
	return kr.ReleaseKey(ctx, rec.Fence())
}

// Both stores of the package release single keys.
var (
	_ KeyReleaser = (*PostgresStore)(nil)
	_ KeyReleaser = (*MemoryStore)(nil)
)
