package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a Store that keeps its keys in the memory of one process.
// It has the same semantics as the Postgres store (expiry, leases, fencing,
// cleanup and erasure), with its own clock standing in for the database's
// now(). It suits tests and single-process programs such as the example
// server's embedded default; several processes, or several MemoryStores,
// never see each other's keys, so it gives no protection across replicas,
// and it loses every key when the process exits.
//
// A MemoryStore is safe for concurrent use. The zero value is an empty store
// ready to use; NewMemoryStore returns one too.
type MemoryStore struct {
	now func() time.Time // the store's clock; nil means time.Now

	mu     sync.Mutex
	lastID int64
	ids    map[memoryKey]int64
	rows   map[int64]*Record // Expired and LeaseOver are never set here
}

// memoryKey is the unique (key, scope, endpoint) of a row.
type memoryKey struct {
	key, scope, endpoint string
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{now: time.Now}
}

// Stored responses are never modified in place: Complete stores a fresh copy
// and Takeover replaces it with the zero Response. A row can therefore be
// copied shallowly under the lock and deep-copied after it is released.

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "claim"); err != nil {
		return ClaimResult{}, err
	}
	k := memoryKey{key: req.Key, scope: req.Scope, endpoint: req.Endpoint}

	s.mu.Lock()
	now := s.clock()
	if id, ok := s.ids[k]; ok {
		rec := *s.rows[id]
		s.mu.Unlock()
		return ClaimResult{Record: memoryReadRecord(rec, now)}, nil
	}
	if s.rows == nil {
		s.ids = make(map[memoryKey]int64)
		s.rows = make(map[int64]*Record)
	}
	s.lastID++
	row := &Record{
		ID:          s.lastID,
		Key:         req.Key,
		Scope:       req.Scope,
		Endpoint:    req.Endpoint,
		RequestHash: req.RequestHash,
		Status:      StatusInFlight,
		Attempt:     1,
		CreatedAt:   now,
		LockedAt:    now,
		LockedUntil: now.Add(req.Lease),
		ExpiresAt:   now.Add(req.TTL),
		Reclaimable: req.Reclaimable,
	}
	s.ids[k] = row.ID
	s.rows[row.ID] = row
	rec := *row
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now)}, nil
}

// Takeover implements Store. Like the Postgres store it is fenced on the
// row's id, its attempt and its expiry, and never takes an in_flight row
// whose lease still runs; the key, scope and endpoint of the row are kept.
func (s *MemoryStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "takeover"); err != nil {
		return ClaimResult{}, err
	}

	s.mu.Lock()
	now := s.clock()
	row, ok := s.rows[f.ID]
	if !ok || row.Attempt != f.Attempt || !row.ExpiresAt.Before(now) || memoryLeaseRunning(row, now) {
		s.mu.Unlock()
		return ClaimResult{}, nil
	}
	row.RequestHash = req.RequestHash
	row.Status = StatusInFlight
	row.Attempt++
	row.Response = Response{}
	row.CreatedAt = now
	row.LockedAt = now
	row.LockedUntil = now.Add(req.Lease)
	row.ExpiresAt = now.Add(req.TTL)
	row.Reclaimable = req.Reclaimable
	rec := *row
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now)}, nil
}

// Reclaim implements Store.
func (s *MemoryStore) Reclaim(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "reclaim"); err != nil {
		return ClaimResult{}, err
	}

	s.mu.Lock()
	now := s.clock()
	row, ok := s.rows[f.ID]
	if !ok || row.Attempt != f.Attempt || row.Status != StatusInFlight || !row.LockedUntil.Before(now) || !row.Reclaimable {
		s.mu.Unlock()
		return ClaimResult{}, nil
	}
	row.Attempt++
	row.LockedAt = now
	row.LockedUntil = now.Add(req.Lease)
	row.ExpiresAt = maxTime(row.ExpiresAt, now.Add(req.TTL))
	rec := *row
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now)}, nil
}

// maxTime returns the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Complete implements Store. It stores a copy of resp, so the caller may
// reuse resp's header and body afterwards.
func (s *MemoryStore) Complete(ctx context.Context, f Fence, resp Response) error {
	resp = memoryCloneResponse(resp)
	return s.finish(ctx, "complete", f, func(row *Record) {
		row.Status = StatusCompleted
		row.Response = resp
	})
}

// Fail implements Store.
func (s *MemoryStore) Fail(ctx context.Context, f Fence) error {
	return s.finish(ctx, "fail", f, func(row *Record) { row.Status = StatusFailed })
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, f Fence) error {
	return s.finish(ctx, "release", f, s.delete)
}

// finish applies an owner's state change to the row f owns in flight, or
// returns ErrNotOwner when f no longer owns it.
func (s *MemoryStore) finish(ctx context.Context, op string, f Fence, change func(*Record)) error {
	if err := memoryCtxError(ctx, op); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	row := s.owned(f)
	if row == nil {
		return ErrNotOwner
	}
	change(row)
	return nil
}

// DeleteExpired implements Store. It deletes the rows that expired first;
// a limit of zero or less deletes nothing.
func (s *MemoryStore) DeleteExpired(ctx context.Context, limit int) (int64, error) {
	if err := memoryCtxError(ctx, "cleanup"); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var expired []*Record
	for _, row := range s.rows {
		if row.ExpiresAt.Before(now) && !memoryLeaseRunning(row, now) {
			expired = append(expired, row)
		}
	}
	if len(expired) > limit {
		slices.SortFunc(expired, func(a, b *Record) int {
			return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.ID, b.ID))
		})
		expired = expired[:limit]
	}
	for _, row := range expired {
		s.delete(row)
	}
	return int64(len(expired)), nil
}

// DeleteScope implements Store. The skipped rows are reported oldest first.
func (s *MemoryStore) DeleteScope(ctx context.Context, scope string) (ErasureResult, error) {
	if err := memoryCtxError(ctx, "erase"); err != nil {
		return ErasureResult{}, err
	}

	var res ErasureResult
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.rows {
		switch {
		case row.Scope != scope:
		case memoryLeaseRunning(row, now):
			res.Skipped = append(res.Skipped, *row)
		default:
			s.delete(row)
			res.Deleted++
		}
	}
	s.mu.Unlock()

	memorySortOldestFirst(res.Skipped)
	for i, rec := range res.Skipped {
		res.Skipped[i] = memoryReadRecord(rec, now)
	}
	return res, nil
}

// ExportScope implements Store.
func (s *MemoryStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	if err := memoryCtxError(ctx, "export"); err != nil {
		return nil, err
	}

	var recs []Record
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.rows {
		if row.Scope == scope {
			recs = append(recs, *row)
		}
	}
	s.mu.Unlock()

	memorySortOldestFirst(recs)
	for i, rec := range recs {
		recs[i] = memoryReadRecord(rec, now)
	}
	return recs, nil
}

// clock returns the store's current time. The time keeps its monotonic
// reading, so expiry and leases are immune to wall-clock jumps.
func (s *MemoryStore) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// owned returns the row f owns in_flight, or nil. s.mu must be held.
func (s *MemoryStore) owned(f Fence) *Record {
	row, ok := s.rows[f.ID]
	if !ok || row.Status != StatusInFlight || row.Attempt != f.Attempt {
		return nil
	}
	return row
}

// delete removes row. s.mu must be held.
func (s *MemoryStore) delete(row *Record) {
	delete(s.ids, memoryKey{key: row.Key, scope: row.Scope, endpoint: row.Endpoint})
	delete(s.rows, row.ID)
}

// memoryLeaseRunning reports whether row is in_flight with its lease not over:
// cleanup and erasure leave such a row alone, since its owner may still
// record its outcome.
func memoryLeaseRunning(row *Record, now time.Time) bool {
	return row.Status == StatusInFlight && !row.LockedUntil.Before(now)
}

// memoryReadRecord returns a copy of a stored row as a read at now sees it: the
// flags computed against now, the response deep-copied and the times
// without their monotonic reading, as a database would return them.
func memoryReadRecord(rec Record, now time.Time) Record {
	rec.Expired = rec.ExpiresAt.Before(now)
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
