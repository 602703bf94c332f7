package idempotency

import (
	"cmp"
	"context"
	"slices"
)

// The MemoryStore's part of reconcile: ending a lease, the fenced
// reconcile claim and the list of stale keys, with the Postgres store's
// semantics.

// endLease implements reconcileStore.EndLease: f's in_flight row's lease ends now.
func (s *MemoryStore) endLease(ctx context.Context, f Fence) error {
	return s.finish(ctx, "end_lease", f, func(row *memoryRow) {
		row.LockedUntil = s.clock()
		s.reorder(row)
	})
}

// claimStale implements reconcileStore.ClaimStale, fenced as pgsql.ReconcileClaimSQL.
func (s *MemoryStore) claimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "reconcile"); err != nil {
		return ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	row := s.owned(f)
	if row == nil || !row.LockedUntil.Before(now) {
		return ClaimResult{Lost: true}, nil
	}
	row.Attempt++
	row.LockedAt = now
	row.LockedUntil = now.Add(req.Lease)
	row.owner = req.Owner
	s.reorder(row)
	return ClaimResult{Won: true, Record: memoryReadRecord(row.Record, now, row.retain)}, nil
}

// stale implements reconcileStore.Stale.
func (s *MemoryStore) stale(ctx context.Context, endpoint string, limit int) ([]Record, error) {
	if err := memoryCtxError(ctx, "stale"); err != nil {
		return nil, err
	}
	var recs []Record
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.rows {
		if row.Endpoint == endpoint && row.Status == StatusInFlight && row.LockedUntil.Before(now) {
			recs = append(recs, memoryReadRecord(row.Record, now, row.retain))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(recs, func(a, b Record) int {
		return cmp.Or(a.LockedUntil.Compare(b.LockedUntil), cmp.Compare(a.ID, b.ID))
	})
	return recs[:min(len(recs), max(limit, 0))], nil
}
