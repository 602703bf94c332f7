package idempotency

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// The MemoryStore's row bookkeeping: its clock, ownership, the expiry
// heap cleanup walks, and copies handed to callers.

// clock returns the store's current time. The time keeps its monotonic
// reading, so expiry and leases are immune to wall-clock jumps.
func (s *MemoryStore) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// owned returns the row f owns in_flight, or nil. s.mu must be held.
func (s *MemoryStore) owned(f Fence) *memoryRow {
	row, ok := s.rows[f.ID]
	if !ok || !memoryFenceRow(row, f) || row.Status != StatusInFlight || row.Attempt != f.Attempt {
		return nil
	}
	return row
}

// memoryFenceRow reports whether f names row's key, as a fenced
// statement of PostgresStore finds its row by the primary key.
func memoryFenceRow(row *memoryRow, f Fence) bool {
	return row.Scope == f.Scope && row.Key == f.Key && row.Endpoint == f.Endpoint
}

// memoryOwns reports whether row is the live claim of the request whose
// owner token is owner: in_flight inside its lease with that token, as
// pgsql.ClaimSQL decides. No token owns nothing.
func memoryOwns(row *memoryRow, owner uuid.UUID, now time.Time) bool {
	return owner != uuid.Nil && row.owner == owner && memoryLeaseRunning(&row.Record, now)
}

// insert adds a new row under k. s.mu must be held.
func (s *MemoryStore) insert(k memoryKey, row *memoryRow) {
	if s.rows == nil {
		s.ids = make(map[memoryKey]int64)
		s.rows = make(map[int64]*memoryRow)
		s.scopes = make(map[string]map[int64]*memoryRow)
	}
	s.ids[k] = row.ID
	s.rows[row.ID] = row
	scope := s.scopes[row.Scope]
	if scope == nil {
		scope = make(map[int64]*memoryRow)
		s.scopes[row.Scope] = scope
	}
	scope[row.ID] = row
	row.due = memoryDue(row)
	heap.Push(&s.expiry, row)
}

// reorder moves row to its place in the cleanup order after a change of
// its status, expiry or lease. s.mu must be held.
func (s *MemoryStore) reorder(row *memoryRow) {
	row.due = memoryDue(row)
	heap.Fix(&s.expiry, row.index)
}

// delete removes row. s.mu must be held.
func (s *MemoryStore) delete(row *memoryRow) {
	delete(s.ids, memoryKey{key: row.Key, scope: row.Scope, endpoint: row.Endpoint})
	delete(s.rows, row.ID)
	if scope := s.scopes[row.Scope]; len(scope) <= 1 {
		delete(s.scopes, row.Scope)
	} else {
		delete(scope, row.ID)
	}
	heap.Remove(&s.expiry, row.index)
	s.unpurge(row)
}

// memoryDue returns when cleanup may delete row: see memoryRow.due.
func memoryDue(row *memoryRow) time.Time {
	if row.Status == StatusInFlight {
		return maxTime(row.retain, row.LockedUntil)
	}
	return row.retain
}

// toPurge queues a completed row that becomes a tombstone at its expiry
// (retain_until after expires_at) for cleanup to purge its response then.
// s.mu must be held.
func (s *MemoryStore) toPurge(row *memoryRow) {
	if row.retain.After(row.ExpiresAt) && row.purgeAt < 0 {
		heap.Push(&s.purge, row)
	}
}

// unpurge takes row out of the purge queue, if it is there. s.mu must be
// held.
func (s *MemoryStore) unpurge(row *memoryRow) {
	if row.purgeAt >= 0 {
		heap.Remove(&s.purge, row.purgeAt)
	}
}

// purgeFirstExpired purges the response of the queued tombstone that
// expired first, when it has expired, keeping its status code, and
// reports whether it did. s.mu must be held.
func (s *MemoryStore) purgeFirstExpired(now time.Time) bool {
	if len(s.purge) == 0 || !s.purge[0].ExpiresAt.Before(now) {
		return false
	}
	s.visits++
	row := heap.Pop(&s.purge).(*memoryRow)
	row.Response = Response{Status: row.Response.Status}
	return true
}

// memoryPurge is a min-heap of rows by expiry, then id (container/heap).
type memoryPurge []*memoryRow

func (h memoryPurge) Len() int { return len(h) }
func (h memoryPurge) Less(i, j int) bool {
	return cmp.Or(h[i].ExpiresAt.Compare(h[j].ExpiresAt), cmp.Compare(h[i].ID, h[j].ID)) < 0
}
func (h memoryPurge) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].purgeAt, h[j].purgeAt = i, j
}
func (h *memoryPurge) Push(x any) {
	row := x.(*memoryRow)
	row.purgeAt = len(*h)
	*h = append(*h, row)
}
func (h *memoryPurge) Pop() any {
	old := *h
	row := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	row.purgeAt = -1
	return row
}

// memoryExpiry is a min-heap of rows by due time, then id
// (container/heap), so the row cleanup may delete first is always on top.
type memoryExpiry []*memoryRow

func (h memoryExpiry) Len() int { return len(h) }

func (h memoryExpiry) Less(i, j int) bool {
	return cmp.Or(h[i].due.Compare(h[j].due), cmp.Compare(h[i].ID, h[j].ID)) < 0
}

func (h memoryExpiry) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *memoryExpiry) Push(x any) {
	row := x.(*memoryRow)
	row.index = len(*h)
	*h = append(*h, row)
}

func (h *memoryExpiry) Pop() any {
	old := *h
	row := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return row
}

// memoryLeaseRunning reports whether row is in_flight with its lease not over:
// cleanup and erasure leave such a row alone, since its owner may still
// record its outcome.
func memoryLeaseRunning(row *Record, now time.Time) bool {
	return row.Status == StatusInFlight && !row.LockedUntil.Before(now)
}

// memoryReadRecord returns a copy of a stored row, retained until retain,
// as a read at now sees it: the flags computed against now, the response
// deep-copied and the times without their monotonic reading, as a
// database would return them.
func memoryReadRecord(rec Record, now, retain time.Time) Record {
	rec.Expired = rec.ExpiresAt.Before(now)
	rec.Tombstone = rec.Expired && retain.After(rec.ExpiresAt) && !retain.Before(now)
	rec.LeaseOver = rec.LockedUntil.Before(now)
	rec.Response = memoryCloneResponse(rec.Response)
	rec.CreatedAt = rec.CreatedAt.Round(0)
	rec.LockedAt = rec.LockedAt.Round(0)
	rec.LockedUntil = rec.LockedUntil.Round(0)
	rec.ExpiresAt = rec.ExpiresAt.Round(0)
	return rec
}

// memorySortOldestFirst orders records by creation time, then by id.
func memorySortOldestFirst(recs []Record) {
	slices.SortFunc(recs, func(a, b Record) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
}

// memoryCloneResponse returns a copy of resp that shares no memory with it.
func memoryCloneResponse(resp Response) Response {
	resp.Header = resp.Header.Clone()
	resp.Body = bytes.Clone(resp.Body)
	return resp
}

// memoryCtxError returns the *StoreError for a context that is already done, or
// nil.
func memoryCtxError(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return &StoreError{Op: op, Reason: ReasonTimeout, Err: err}
	}
	return nil
}
