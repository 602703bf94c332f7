package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/internal/operator"
)

// A sealing store is one of two types: a Store, or a TxStore when its
// inner store is one (the only capability outside Store). The CLI's
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

// variant returns w as a TxStore when its inner store is one, else as a
// plain Store: the capabilities of the wrapper are exactly its inner
// store's.
func (w *sealingStore) variant() Store {
	if _, ok := w.inner.(TxStore); ok {
		return sealingTxStore{w}
	}
	return w
}
