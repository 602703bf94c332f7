package idempotency

import (
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
)

// The Postgres statements, for the raw-SQL floor benchmarks in the external
// test package.
const (
	ClaimSQLForTest    = pgsql.ClaimSQL
	CompleteSQLForTest = pgsql.CompleteSQL
)

// RoundLockWaitForTest is a round's lock_timeout (pgsql.RoundSettingsSQL's $1).
var RoundLockWaitForTest = roundLockWait

// NewMemoryStoreForTest returns a MemoryStore on the clock now.
func NewMemoryStoreForTest(now func() time.Time, opts ...MemoryOption) *MemoryStore {
	s := NewMemoryStore(opts...)
	s.now = now
	return s
}

// FakeClockForTest is the in-package harness's clock, for the external
// tests: Now for NewMemoryStoreForTest, Advance to move it.
type FakeClockForTest = fakeClock

// NewFakeClockForTest returns a fake clock at 2026-07-10 12:00 UTC.
func NewFakeClockForTest() *FakeClockForTest {
	return &fakeClock{t: time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)}
}

// CleanupVisitsForTest returns how many rows cleanup has looked at.
func (s *MemoryStore) CleanupVisitsForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.visits
}

// ClaimArgsForTest is pgsql.ClaimSQL's parameters for req, as Claim sends them.
func ClaimArgsForTest(req ClaimRequest) []any { return claimArgs(req) }

// CompleteArgsForTest is pgsql.CompleteSQL's parameters for f and resp, as
// Complete first sends them (fenced puts the fence first).
func CompleteArgsForTest(f Fence, resp Response) ([]any, error) {
	jsonBody, rawBody, headers, err := completeArgs(resp)
	if err != nil {
		return nil, err
	}
	return []any{f.ID, f.Attempt, f.Scope, resp.Status, jsonBody, rawBody, headers, sealKeyArg(resp.SealKeyID), f.Key, f.Endpoint}, nil
}

// WatchForTest is the store's registration of a waiter for row id
// (watcher), as a waiting duplicate makes it.
func WatchForTest(s Store, id int64) (<-chan struct{}, func()) { return watchRow(s, id) }
