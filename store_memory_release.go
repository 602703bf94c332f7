package idempotency

import (
	"context"
	"slices"
	"strings"
)

// LookupKey implements KeyReleaser.
func (s *MemoryStore) LookupKey(ctx context.Context, key, scope string) ([]Record, error) {
	if err := memoryCtxError(ctx, "lookup"); err != nil {
		return nil, err
	}
	var recs []Record
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.scopes[scope] {
		if row.Key == key {
			recs = append(recs, memoryReadRecord(row.Record, now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(recs, func(a, b Record) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return recs, nil
}

// ReleaseKey implements KeyReleaser.
func (s *MemoryStore) ReleaseKey(ctx context.Context, f Fence) (bool, error) {
	if err := memoryCtxError(ctx, "release"); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	row, ok := s.rows[f.ID]
	if !ok || row.Attempt != f.Attempt || row.Scope != f.Scope {
		return false, nil
	}
	rec := memoryReadRecord(row.Record, s.clock())
	if !Releasable(rec) {
		return false, nil
	}
	s.delete(row)
	return true, nil
}
