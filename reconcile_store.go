package idempotency

import (
	"context"
	"errors"
)

// reconcileStore is what Unsettled and reconcile need of a store beyond
// Store: every store of this module has it (MemoryStore, PostgresStore,
// sqlstore.Store, the sealing wrapper), and another store may implement
// it (docs/reconcile.md). It is not part of Store, so a Store written
// before it still compiles; a route with a Reconcile hook refuses a store
// without it.
type reconcileStore interface {
	// EndLease ends f's lease now (locked_until = now), only while f owns
	// the row in_flight, else ErrNotOwner.
	EndLease(ctx context.Context, f Fence) error
	// ClaimStale takes a reconcile claim: only while f's row is in_flight
	// with f.Attempt and its lease over, it moves the attempt on and sets
	// req's Lease and Owner, keeping the rest; else Lost.
	ClaimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error)
	// Stale returns at most limit in_flight rows of endpoint whose lease is
	// over, the longest stale first.
	Stale(ctx context.Context, endpoint string, limit int) ([]Record, error)
}

// reconcilerOf returns s's reconcileStore: the memory and Postgres
// stores' own, or s itself when it has one; else one that fails every
// call with errNoReconcile.
func reconcilerOf(s Store) reconcileStore {
	switch s := s.(type) {
	case *MemoryStore:
		return memoryReconciler{s}
	case *PostgresStore:
		return pgReconciler{s}
	case reconcileStore:
		return s
	}
	return noReconciler{}
}

// errNoReconcile is a store without EndLease, ClaimStale and Stale.
var errNoReconcile = errors.New("idempotency: the store does not implement EndLease, ClaimStale and Stale (docs/reconcile.md)")

// canReconcile reports whether s implements reconcileStore.
func canReconcile(s Store) bool {
	_, none := reconcilerOf(s).(noReconciler)
	return !none
}

type memoryReconciler struct{ s *MemoryStore }

func (r memoryReconciler) EndLease(ctx context.Context, f Fence) error { return r.s.endLease(ctx, f) }
func (r memoryReconciler) ClaimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return r.s.claimStale(ctx, f, req)
}
func (r memoryReconciler) Stale(ctx context.Context, endpoint string, limit int) ([]Record, error) {
	return r.s.stale(ctx, endpoint, limit)
}

type pgReconciler struct{ s *PostgresStore }

func (r pgReconciler) EndLease(ctx context.Context, f Fence) error { return r.s.endLease(ctx, f) }
func (r pgReconciler) ClaimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return r.s.claimStale(ctx, f, req)
}
func (r pgReconciler) Stale(ctx context.Context, endpoint string, limit int) ([]Record, error) {
	return r.s.stale(ctx, endpoint, limit)
}

// noReconciler is the reconcileStore of a store without one.
type noReconciler struct{}

func (noReconciler) EndLease(context.Context, Fence) error {
	return &StoreError{Op: "end_lease", Reason: ReasonSchema, Err: errNoReconcile}
}
func (noReconciler) ClaimStale(context.Context, Fence, ClaimRequest) (ClaimResult, error) {
	return ClaimResult{}, &StoreError{Op: opReconcile, Reason: ReasonSchema, Err: errNoReconcile}
}
func (noReconciler) Stale(context.Context, string, int) ([]Record, error) {
	return nil, &StoreError{Op: opStale, Reason: ReasonSchema, Err: errNoReconcile}
}
