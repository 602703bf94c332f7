package sqlstore

import (
	"context"

	"github.com/idemkit/idempotency"
)

// EndLease implements idempotency.RouteTx: f's in_flight row gets a lease
// that ends now, fenced as Fail is, on a connection of the pool
// (autocommit), outside the route's transaction, which has ended: the
// handler's own COMMIT made the claim permanent, so the retry answers
// idempotency_outcome_unknown. When nothing committed it finds no row
// (ErrNotOwner) and the key is free.
func (t *routeTx) EndLease(ctx context.Context, f idempotency.Fence) error {
	return t.s.fenced(ctx, "end_lease", t.s.st.endLease, t.s.fenceArgs(f)...)
}
