package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/internal/seal"
)

// sealingStore is NewSealingStore's Store: it seals on the way in
// (Complete, RouteTx.Commit) and opens on the way out (a claim's
// existing row, an export, a lookup).
type sealingStore struct {
	inner  Store
	sealer *seal.Sealer
}

// unsealError is a row that does not open: its identity and key id for the
// log (never the key, and no key or scope of a request, which logs redact
// by attribute).
type unsealError struct {
	id      int64
	attempt int32
	keyID   string
	err     error
}

func (e *unsealError) Error() string {
	return fmt.Sprintf("row %d (attempt %d), sealed with key id %q: %v", e.id, e.attempt, e.keyID, e.err)
}

func (e *unsealError) Unwrap() error { return e.err }

// sealRow is what a value of rec is bound to, the response's status
// included.
func sealRow(f Fence, rec *Record, status int) seal.Row {
	return seal.Row{ID: f.ID, Attempt: f.Attempt, Scope: f.Scope, Endpoint: rec.Endpoint,
		Key: rec.Key, RequestHash: rec.RequestHash, Status: status}
}

// seal returns resp sealed for the row f owns; a response sealed already
// is stored as it is (sealing it again would lose its key id).
func (w *sealingStore) seal(ctx context.Context, op string, f Fence, owner *Record, resp Response) (Response, error) {
	if resp.SealKeyID != "" {
		return resp, nil
	}
	id, sealed, err := w.sealer.Seal(ctx, sealRow(f, owner, resp.Status),
		seal.Plain{Kind: uint8(resp.BodyKind), Header: resp.Header, Body: resp.Body})
	if err != nil {
		return Response{}, &StoreError{Op: op, Reason: ReasonSeal, Err: err}
	}
	return Response{Status: resp.Status, Body: sealed, BodyKind: BodyRaw, SealKeyID: id}, nil
}

// open replaces rec's sealed response by the response it seals, or fails
// with a *StoreError of reason ReasonUnseal. A plaintext response is
// marked, for the replay count.
func (w *sealingStore) open(ctx context.Context, op string, rec *Record) error {
	resp := &rec.Response
	if resp.SealKeyID == "" {
		resp.plaintext = rec.Status == StatusCompleted
		return nil
	}
	p, err := w.sealer.Open(ctx, sealRow(rec.Fence(), rec, resp.Status), resp.SealKeyID, resp.Body)
	if err != nil {
		return &StoreError{Op: op, Reason: ReasonUnseal,
			Err: &unsealError{id: rec.ID, attempt: rec.Attempt, keyID: resp.SealKeyID, err: err}}
	}
	*resp = Response{Status: resp.Status, Header: p.Header, Body: p.Body, BodyKind: BodyKind(p.Kind)}
	return nil
}

// openClaimed opens the existing row a claim read. An expired row is a
// new key to the claim, taken over without its response: it is not opened,
// so a row sealed with a retired key never blocks its key.
func (w *sealingStore) openClaimed(ctx context.Context, res *ClaimResult) error {
	if res.Won || res.Record.Expired {
		return nil
	}
	return w.open(ctx, "claim", &res.Record)
}

// Claim implements Store.
func (w *sealingStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	res, err := w.inner.Claim(ctx, req)
	if err == nil {
		err = w.openClaimed(ctx, &res)
	}
	if err != nil {
		return ClaimResult{}, err
	}
	return res, nil
}

// Takeover implements Store: a row taken over holds no response.
func (w *sealingStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return w.inner.Takeover(ctx, f, req)
}

// Complete implements Store: resp goes to inner sealed, bound to owner's
// row.
func (w *sealingStore) Complete(ctx context.Context, f Fence, owner Record, resp Response) error {
	sealed, err := w.seal(ctx, "complete", f, &owner, resp)
	if err != nil {
		return err
	}
	return w.inner.Complete(ctx, f, owner, sealed)
}

// Fail implements Store.
func (w *sealingStore) Fail(ctx context.Context, f Fence) error { return w.inner.Fail(ctx, f) }

// Renew implements Store.
func (w *sealingStore) Renew(ctx context.Context, f Fence, req ClaimRequest) error {
	return w.inner.Renew(ctx, f, req)
}

// Release implements Store.
func (w *sealingStore) Release(ctx context.Context, f Fence) error { return w.inner.Release(ctx, f) }

// Cleanup implements Store.
func (w *sealingStore) Cleanup(ctx context.Context, limit int) (int64, error) {
	return w.inner.Cleanup(ctx, limit)
}

// Probe implements Store: the inner store's verdict.
func (w *sealingStore) Probe(ctx context.Context) error { return w.inner.Probe(ctx) }

// watch is the inner store's wake-ups (watcher).
func (w *sealingStore) watch(id int64) (<-chan struct{}, func()) { return watchRow(w.inner, id) }

// Erase implements Store: the rows it skips are in flight, with no
// response to open.
func (w *sealingStore) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	return w.inner.Erase(ctx, scope)
}

// ExportScope implements Store: every response is opened; a row that does
// not open fails the export.
func (w *sealingStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	recs, err := w.inner.ExportScope(ctx, scope)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		if err := w.open(ctx, "export", &recs[i]); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// ReleaseOwner implements Store, delegated to inner: the row holds no
// response to seal.
func (w *sealingStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	return w.inner.ReleaseOwner(ctx, req)
}

// Check implements Store, delegated to inner.
func (w *sealingStore) Check(ctx context.Context) error { return w.inner.Check(ctx) }

// EndLease implements reconcileStore, delegated to inner: an in_flight row holds
// no response.
func (w *sealingStore) EndLease(ctx context.Context, f Fence) error {
	return reconcilerOf(w.inner).EndLease(ctx, f)
}

// ClaimStale implements reconcileStore, delegated to inner: the row it claims is in
// flight, with no response to open.
func (w *sealingStore) ClaimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return reconcilerOf(w.inner).ClaimStale(ctx, f, req)
}

// Stale implements reconcileStore, delegated to inner: stale rows hold no response.
func (w *sealingStore) Stale(ctx context.Context, endpoint string, limit int) ([]Record, error) {
	return reconcilerOf(w.inner).Stale(ctx, endpoint, limit)
}

// sealingTxStore is a sealing store over a TxStore: the only other
// variant, so a transactional route is served through the wrapper exactly
// when it would be without.
type sealingTxStore struct{ *sealingStore }

// BeginClaim implements TxStore, opening the claimed row's response and
// sealing the record the transaction commits (sealingTx).
func (w sealingTxStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	tx, res, err := w.inner.(TxStore).BeginClaim(ctx, req)
	if err != nil || tx == nil {
		return tx, res, err
	}
	if err := w.openClaimed(ctx, &res); err != nil {
		_ = tx.Abort(ctx)
		return nil, ClaimResult{}, err
	}
	return &sealingTx{RouteTx: tx, w: w.sealingStore}, res, nil
}

// TxLockWaitBudget implements TxStore: the inner store's budget.
func (w sealingTxStore) TxLockWaitBudget(wait time.Duration) time.Duration {
	return w.inner.(TxStore).TxLockWaitBudget(wait)
}

// sealingTx is a sealing store's RouteTx: its record is sealed before it
// commits.
type sealingTx struct {
	RouteTx
	w *sealingStore
}

// Commit implements RouteTx. A response that cannot be sealed commits
// nothing: the caller aborts, and the claim rolls back with the handler's
// writes.
func (t *sealingTx) Commit(ctx context.Context, s *Settlement) error {
	if s == nil || s.Failed {
		return t.RouteTx.Commit(ctx, s)
	}
	sealed, err := t.w.seal(ctx, "complete", s.Fence, &s.Owner, s.Response)
	if err != nil {
		return err
	}
	c := *s
	c.Response = sealed
	return t.RouteTx.Commit(ctx, &c)
}

// errSealedNotOpened is what the middleware logs for a sealed response a
// store that does not seal returned.
var errSealedNotOpened = errors.New("the store does not seal (wrap it with NewSealingStore and the key)")
