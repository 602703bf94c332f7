package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
)

// MemoryStore is a Store in one process's memory with the Postgres store's
// semantics, for tests and single-process programs: nothing survives an
// exit, and only MemoryMaxRows bounds it. It is safe for concurrent use;
// the zero value is an empty store without a cap.
type MemoryStore struct {
	now     func() time.Time // the store's clock; nil means time.Now
	maxRows int              // 0: no cap

	mu     sync.Mutex
	lastID int64
	ids    map[memoryKey]int64
	rows   map[int64]*memoryRow
	scopes map[string]map[int64]*memoryRow // the rows of each scope, for erasure and export
	expiry memoryExpiry                    // every row, the first cleanup may delete on top
	purge  memoryPurge                     // tombstones-to-be holding a response, the first to expire on top
	visits int                             // rows cleanup looked at (tests)
	wakes  wakeups                         // waiting duplicates (Watch), woken by finish
}

// memoryRow is a stored row with its place in the cleanup order.
type memoryRow struct {
	Record // Expired and LeaseOver are never set here
	// due is when cleanup may delete the row: its retain_until, or for an
	// in_flight row the later of that and its lease end (a running lease keeps a
	// row). The row may go once due is before now.
	due     time.Time
	index   int       // its index in MemoryStore.expiry
	retain  time.Time // retain_until: ExpiresAt + ClaimRequest.Grace
	purgeAt int       // its index in MemoryStore.purge, -1 when not there
	owner   uuid.UUID // the current owner's token (ClaimRequest.Owner); uuid.Nil for none
}

// memoryKey is the unique (key, scope, endpoint) of a row.
type memoryKey struct {
	key, scope, endpoint string
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore configured by opts.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	s := &MemoryStore{now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// MemoryOption configures a MemoryStore built by NewMemoryStore.
type MemoryOption func(*MemoryStore)

// MemoryMaxRows caps the rows at n (0: no cap, the default; negative
// panics). A new key in a full store evicts the first-expired row Cleanup
// could delete; without one it fails with ReasonFull (503 on every policy).
func MemoryMaxRows(n int) MemoryOption {
	if n < 0 {
		panic(fmt.Sprintf("idempotency: MemoryMaxRows must not be negative, got %d", n))
	}
	return func(s *MemoryStore) { s.maxRows = n }
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
		row := s.rows[id]
		rec, mine := row.Record, memoryOwns(row, req.Owner, now)
		s.mu.Unlock()
		return ClaimResult{Won: mine, Record: memoryReadRecord(rec, now, row.retain)}, nil
	}
	if s.maxRows > 0 && len(s.rows) >= s.maxRows && !s.deleteFirstExpired(now) {
		s.mu.Unlock()
		return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonFull,
			Err: fmt.Errorf("the memory store holds its maximum of %d rows, none of them expired", s.maxRows)}
	}
	s.lastID++
	row := &memoryRow{Record: Record{
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
		DeriveKeyID: req.DeriveKeyID,
	}, retain: now.Add(req.TTL + req.Grace), purgeAt: -1, owner: req.Owner}
	s.insert(k, row)
	rec := row.Record
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now, row.retain)}, nil
}

// Takeover implements Store, fenced as the Postgres store's.
func (s *MemoryStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "takeover"); err != nil {
		return ClaimResult{}, err
	}

	s.mu.Lock()
	now := s.clock()
	row, ok := s.rows[f.ID]
	if !ok || !memoryFenceRow(row, f) || row.Attempt != f.Attempt || !row.retain.Before(now) || memoryLeaseRunning(&row.Record, now) {
		s.mu.Unlock()
		return ClaimResult{Lost: true}, nil
	}
	row.RequestHash = req.RequestHash
	row.Status = StatusInFlight
	row.Attempt++
	row.Response = Response{}
	row.CreatedAt = now
	row.LockedAt = now
	row.LockedUntil = now.Add(req.Lease)
	row.ExpiresAt = now.Add(req.TTL)
	row.retain = now.Add(req.TTL + req.Grace)
	row.owner = req.Owner
	if row.DeriveKeyID == "" { // the row's derived keys stay those of its first claim
		row.DeriveKeyID = req.DeriveKeyID
	}
	s.reorder(row)
	s.unpurge(row)
	rec := row.Record
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now, row.retain)}, nil
}

// maxTime returns the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Complete implements Store, storing a copy of resp.
func (s *MemoryStore) Complete(ctx context.Context, f Fence, _ Record, resp Response) error {
	resp = memoryCloneResponse(resp)
	return s.finish(ctx, "complete", f, func(row *memoryRow) {
		row.Status = StatusCompleted
		row.Response = resp
		s.reorder(row) // no longer held by its lease
		s.toPurge(row)
	})
}

// Fail implements Store.
func (s *MemoryStore) Fail(ctx context.Context, f Fence) error {
	return s.finish(ctx, "fail", f, func(row *memoryRow) {
		row.Status = StatusFailed
		s.reorder(row) // no longer held by its lease
	})
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, f Fence) error {
	return s.finish(ctx, "release", f, s.delete)
}

// Renew implements Store, fenced as the Postgres store's.
func (s *MemoryStore) Renew(ctx context.Context, f Fence, req ClaimRequest) error {
	if err := memoryCtxError(ctx, "renew"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	row, now := s.owned(f), s.clock()
	if row == nil || !memoryOwns(row, req.Owner, now) {
		return ErrNotOwner
	}
	row.LockedUntil = now.Add(req.Lease)
	s.reorder(row) // held by its lease for longer
	return nil
}

// finish applies an owner's state change to the row f owns in flight, or
// returns ErrNotOwner when f no longer owns it.
func (s *MemoryStore) finish(ctx context.Context, op string, f Fence, change func(*memoryRow)) error {
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
	s.wakes.wake(f.ID)
	return nil
}

// ReleaseOwner implements Store: it deletes the key's row only
// while it is in_flight with the owner token req.Owner.
func (s *MemoryStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	if err := memoryCtxError(ctx, "release"); err != nil {
		return false, err
	}
	if req.Owner == uuid.Nil {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[memoryKey{key: req.Key, scope: req.Scope, endpoint: req.Endpoint}]
	if !ok {
		return false, nil
	}
	row := s.rows[id]
	if row.Status != StatusInFlight || row.owner != req.Owner {
		return false, nil
	}
	s.delete(row)
	return true, nil
}

// Cleanup implements Store, purging and deleting the rows whose time ran
// out first, at a cost proportional to the rows it changes.
func (s *MemoryStore) Cleanup(ctx context.Context, limit int) (int64, error) {
	if err := memoryCtxError(ctx, "cleanup"); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var n, purged int64
	for purged < int64(limit) && s.purgeFirstExpired(now) {
		purged++
	}
	for n < int64(limit) && s.deleteFirstExpired(now) {
		n++
	}
	return n + purged, nil
}

// deleteFirstExpired deletes the row whose time ran out first, when cleanup
// may delete it (expired, and not in_flight inside its lease), and reports
// whether it did. s.mu must be held.
func (s *MemoryStore) deleteFirstExpired(now time.Time) bool {
	if len(s.expiry) == 0 {
		return false
	}
	s.visits++
	row := s.expiry[0]
	if !row.due.Before(now) {
		return false
	}
	s.delete(row)
	return true
}

// Erase implements Store. The skipped rows are reported oldest first.
func (s *MemoryStore) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	if err := memoryCtxError(ctx, "erase"); err != nil {
		return ErasureResult{}, err
	}

	var res ErasureResult
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.scopes[scope] {
		switch {
		case memoryLeaseRunning(&row.Record, now):
			res.Skipped = append(res.Skipped, memoryReadRecord(row.Record, now, row.retain))
		default:
			s.delete(row)
			res.Deleted++
		}
	}
	s.mu.Unlock()

	memorySortOldestFirst(res.Skipped)
	return res, nil
}

// Probe implements Store: nil, there is no database to lose.
func (s *MemoryStore) Probe(context.Context) error { return nil }

// ExportScope implements Store.
func (s *MemoryStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	if err := memoryCtxError(ctx, "export"); err != nil {
		return nil, err
	}

	var recs []Record
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.scopes[scope] {
		recs = append(recs, memoryReadRecord(row.Record, now, row.retain))
	}
	s.mu.Unlock()

	memorySortOldestFirst(recs)
	return recs, nil
}

// Check implements Store: a MemoryStore has no schema to check.
func (s *MemoryStore) Check(context.Context) error { return nil }

// watch wakes waiters at once (watcher).
func (s *MemoryStore) watch(id int64) (<-chan struct{}, func()) { return s.wakes.watch(id) }
