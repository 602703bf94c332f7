package idempotency

import (
	"context"
	"slices"
	"strings"
)

// Lookup implements KeyReleaser: the rows of key in scope, on every
// endpoint, or on endpoint alone when it is not "".
func (s *MemoryStore) Lookup(ctx context.Context, key, scope, endpoint string) (KeyRows, error) {
	if err := memoryCtxError(ctx, "lookup"); err != nil {
		return KeyRows{}, err
	}
	var out KeyRows
	s.mu.Lock()
	out.Now = s.clock()
	for _, row := range s.scopes[scope] {
		if row.Key == key && (endpoint == "" || row.Endpoint == endpoint) {
			out.Records = append(out.Records, memoryReadRecord(row.Record, out.Now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out.Records, func(a, b Record) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out, nil
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
