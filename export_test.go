package idempotency

import "time"

// The Postgres statements, for the raw-SQL floor benchmarks in the external
// test package.
const (
	ClaimSQLForTest    = pgClaimSQL
	CompleteSQLForTest = pgCompleteSQL
)

// NewMemoryStoreForTest returns a MemoryStore on the clock now.
func NewMemoryStoreForTest(now func() time.Time, opts ...MemoryOption) *MemoryStore {
	s := NewMemoryStore(opts...)
	s.now = now
	return s
}

// CleanupVisitsForTest returns how many rows cleanup has looked at.
func (s *MemoryStore) CleanupVisitsForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.visits
}
