package idempotency

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// MemoryStore is a Store that keeps its keys in the memory of one process.
// It has the same semantics as the Postgres store (expiry, leases, fencing,
// cleanup and erasure), with its own clock standing in for the database's
// now(). It suits tests and single-process programs such as the example
// server's embedded default; several processes, or several MemoryStores,
// never see each other's keys, so it gives no protection across replicas,
// and it loses every key when the process exits.
//
// Memory is bounded only by MemoryMaxRows: without it, a client that sends
// new keys fills the process's memory for the keys' TTL. Cleanup
// (DeleteExpired) costs in proportion to the rows it deletes, erasure and
// export to the rows of the scope, never to the whole store.
//
// A MemoryStore is safe for concurrent use. The zero value is an empty store
// ready to use, without a cap; NewMemoryStore returns one too.
type MemoryStore struct {
	now     func() time.Time // the store's clock; nil means time.Now
	maxRows int              // 0: no cap

	mu     sync.Mutex
	lastID int64
	ids    map[memoryKey]int64
	rows   map[int64]*memoryRow
	scopes map[string]map[int64]*memoryRow // the rows of each scope, for erasure and export
	expiry memoryExpiry                    // every row, the first cleanup may delete on top
	visits int                             // rows cleanup looked at (tests)
}

// memoryRow is a stored row with its place in the cleanup order.
type memoryRow struct {
	Record // Expired and LeaseOver are never set here
	// due is when cleanup may delete the row: its expiry, or for an
	// in_flight row the later of its expiry and its lease end (a running
	// lease keeps a row). The row may go once due is before now.
	due   time.Time
	index int       // its index in MemoryStore.expiry
	owner uuid.UUID // the current owner's token (ClaimRequest.Owner); uuid.Nil for none
}

// memoryKey is the unique (key, scope, endpoint) of a row.
type memoryKey struct {
	key, scope, endpoint string
}

var (
	_ Store         = (*MemoryStore)(nil)
	_ OwnerReleaser = (*MemoryStore)(nil)
)

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

// MemoryMaxRows caps the rows the store holds at n, expired rows that
// cleanup has not deleted yet included. When the store is full, a claim of
// a new key first deletes the row whose time ran out first, if cleanup
// could delete it; otherwise the claim fails with a *StoreError of reason
// ReasonFull, which the middleware answers with 503
// idempotency_store_unavailable on fail-closed and fail-open routes alike:
// a full store is never bypassed, since any client can fill it on purpose.
// Keys already stored are still answered (replays, conflicts, takeovers of
// expired keys). A row takes about 600 bytes plus its recorded response
// (measured: 540 bytes with a short scope and endpoint). n of 0 means no
// cap, the default; MemoryMaxRows panics when n is negative.
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
		return ClaimResult{Won: mine, Record: memoryReadRecord(rec, now)}, nil
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
		Reclaimable: req.Reclaimable,
	}, owner: req.Owner}
	s.insert(k, row)
	rec := row.Record
	s.mu.Unlock()
	return ClaimResult{Won: true, Record: memoryReadRecord(rec, now)}, nil
}

// Takeover implements Store. Like the Postgres store it is fenced on the
// row's id, scope, attempt and expiry, and never takes an in_flight row
// whose lease still runs; the key, scope and endpoint of the row are kept.
func (s *MemoryStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	if err := memoryCtxError(ctx, "takeover"); err != nil {
		return ClaimResult{}, err
	}

	s.mu.Lock()
	now := s.clock()
	row, ok := s.rows[f.ID]
	if !ok || row.Scope != f.Scope || row.Attempt != f.Attempt || !row.ExpiresAt.Before(now) || memoryLeaseRunning(&row.Record, now) {
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
	row.owner = req.Owner
	s.reorder(row)
	rec := row.Record
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
	if !ok || row.Scope != f.Scope || row.Attempt != f.Attempt || row.Status != StatusInFlight || !row.LockedUntil.Before(now) || !row.Reclaimable {
		s.mu.Unlock()
		return ClaimResult{}, nil
	}
	row.Attempt++
	row.LockedAt = now
	row.LockedUntil = now.Add(req.Lease)
	row.ExpiresAt = maxTime(row.ExpiresAt, now.Add(req.TTL))
	row.owner = req.Owner
	s.reorder(row)
	rec := row.Record
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
	return s.finish(ctx, "complete", f, func(row *memoryRow) {
		row.Status = StatusCompleted
		row.Response = resp
		s.reorder(row) // no longer held by its lease
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
	return nil
}

// ReleaseOwner implements OwnerReleaser: it deletes the key's row only
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

// DeleteExpired implements Store. It deletes the rows whose time ran out
// first; a limit of zero or less deletes nothing. Its cost is proportional
// to the rows it deletes, whatever the store holds.
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
	var n int64
	for n < int64(limit) && s.deleteFirstExpired(now) {
		n++
	}
	return n, nil
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

// DeleteScope implements Store. The skipped rows are reported oldest first.
func (s *MemoryStore) DeleteScope(ctx context.Context, scope string) (ErasureResult, error) {
	if err := memoryCtxError(ctx, "erase"); err != nil {
		return ErasureResult{}, err
	}

	var res ErasureResult
	s.mu.Lock()
	now := s.clock()
	for _, row := range s.scopes[scope] {
		switch {
		case memoryLeaseRunning(&row.Record, now):
			res.Skipped = append(res.Skipped, row.Record)
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
	for _, row := range s.scopes[scope] {
		recs = append(recs, row.Record)
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
func (s *MemoryStore) owned(f Fence) *memoryRow {
	row, ok := s.rows[f.ID]
	if !ok || row.Scope != f.Scope || row.Status != StatusInFlight || row.Attempt != f.Attempt {
		return nil
	}
	return row
}

// memoryOwns reports whether row is the live claim of the request whose
// owner token is owner: in_flight inside its lease with that token, as
// pgClaimSQL decides. No token owns nothing.
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
	row.due = memoryDue(&row.Record)
	heap.Push(&s.expiry, row)
}

// reorder moves row to its place in the cleanup order after a change of
// its status, expiry or lease. s.mu must be held.
func (s *MemoryStore) reorder(row *memoryRow) {
	row.due = memoryDue(&row.Record)
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
}

// memoryDue returns when cleanup may delete row: see memoryRow.due.
func memoryDue(row *Record) time.Time {
	if row.Status == StatusInFlight {
		return maxTime(row.ExpiresAt, row.LockedUntil)
	}
	return row.ExpiresAt
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
