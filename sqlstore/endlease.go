package sqlstore

import (
	"context"
	"strings"

	"github.com/idemkit/idempotency"
)

// EndLease implements idempotency.RouteTx: the fenced statement of Fail,
// setting the lease to end now instead of marking the row failed, on a
// connection of the pool (autocommit), outside the route's transaction.
//
// A stopgap of the engine rule's commit (r4-pgxtx), so the module builds:
// the sqlstore work of round 4 owns this file and may replace it.
func (t *routeTx) EndLease(ctx context.Context, f idempotency.Fence) error {
	now := "now()"
	if t.s.d.name != PostgreSQL {
		now = mysqlNow
	}
	stmt := strings.Replace(t.s.st.fail, "SET status = 'failed'", "SET locked_until = "+now, 1)
	return t.s.fenced(ctx, "end_lease", stmt, t.s.fenceArgs(f)...)
}
