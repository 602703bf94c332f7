package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/internal/operator"
)

// The middleware finds what a store can do by type assertion (TxStore for
// transactional routes, with its lock-wait budget, OwnerReleaser to free
// a claim whose reply was lost, Check at start-up). A wrapper that lacked one would switch its
// feature off without a word, and one that claimed one its inner store
// lacks would fail at run time: so a sealing store is one of eight types,
// each with exactly the optional interfaces of its inner store. The CLI's
// operator access (internal/operator) is resolved through the wrapper to
// its inner store's, its lookup opening what it can.

func init() {
	operator.Register(func(store any) (any, bool) {
		s, ok := store.(interface{ sealing() *sealingStore })
		if !ok {
			return nil, false
		}
		w := s.sealing()
		ops, ok := operator.For[Record, Fence](w.inner)
		if !ok {
			return nil, false
		}
		inner := ops.Lookup
		ops.Lookup = func(ctx context.Context, key, scope, endpoint string) ([]Record, time.Time, error) {
			recs, now, err := inner(ctx, key, scope, endpoint)
			w.openRows(ctx, recs)
			return recs, now, err
		}
		return ops, true
	})
}

// sealing returns the sealing store a variant embeds.
func (w *sealingStore) sealing() *sealingStore { return w }

// openRows opens what it can of recs and leaves a row it cannot open
// sealed (SealKeyID set), so an operator still sees, and may release, the
// rest.
func (w *sealingStore) openRows(ctx context.Context, recs []Record) {
	for i := range recs {
		rec := recs[i]
		if w.open(ctx, "lookup", &rec) == nil {
			recs[i] = rec
		}
	}
}

// One method set per optional interface, each delegating to the sealing
// store.
type (
	sealTxStore       struct{ w *sealingStore }
	sealOwnerReleaser struct{ w *sealingStore }
	sealChecker       struct{ w *sealingStore }
)

func (m sealTxStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	return m.w.beginClaim(ctx, req)
}

// TxLockWaitBudget is the inner store's budget (txWaitBudgeter), or the
// middleware's default for a TxStore without one: the answer the
// middleware would get from the inner store itself, so a transactional
// route is refused through the wrapper exactly when it would be without.
func (m sealTxStore) TxLockWaitBudget(wait time.Duration) time.Duration {
	if b, ok := m.w.inner.(txWaitBudgeter); ok {
		return b.TxLockWaitBudget(wait)
	}
	return txWaitBudget(wait)
}

func (m sealOwnerReleaser) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	return m.w.releaseOwner(ctx, req)
}

func (m sealChecker) Check(ctx context.Context) error { return m.w.check(ctx) }

// withInterfaces returns w as the type whose optional interfaces are
// exactly those of w.inner.
func (w *sealingStore) withInterfaces() Store {
	var mask int
	for i, has := range []bool{is[TxStore](w.inner), is[OwnerReleaser](w.inner), is[checker](w.inner)} {
		if has {
			mask |= 1 << i
		}
	}
	t, o, c := sealTxStore{w}, sealOwnerReleaser{w}, sealChecker{w}
	switch mask {
	case 0b001:
		return struct {
			*sealingStore
			sealTxStore
		}{w, t}
	case 0b010:
		return struct {
			*sealingStore
			sealOwnerReleaser
		}{w, o}
	case 0b011:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
		}{w, t, o}
	case 0b100:
		return struct {
			*sealingStore
			sealChecker
		}{w, c}
	case 0b101:
		return struct {
			*sealingStore
			sealTxStore
			sealChecker
		}{w, t, c}
	case 0b110:
		return struct {
			*sealingStore
			sealOwnerReleaser
			sealChecker
		}{w, o, c}
	case 0b111:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
			sealChecker
		}{w, t, o, c}
	}
	return w
}

// is reports whether v implements T.
func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}
