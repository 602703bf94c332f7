package idempotency

import (
	"context"

	"github.com/idemkit/idempotency/internal/pgsql"
)

// releaseKey releases one stuck key for an operator
// (operator.Store.ReleaseKey) with one fenced DELETE, idempotent, so a lost
// connection is retried.
func (s *PostgresStore) releaseKey(ctx context.Context, f Fence) (bool, error) {
	var n int64
	err := retryConnLoss(ctx, func() error {
		tag, err := s.pool.Exec(ctx, pgsql.ReleaseKeySQL, f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, pgStoreError("release", err)
	}
	return n > 0, nil
}
