package idempotency

import "context"

// pgReleaseKeySQL deletes a row an operator releases, fenced on the
// attempt it was read with, only while it is failed or in flight past its
// lease (by the database's clock).
//
// $1 id, $2 attempt, $3 scope, $4 key, $5 endpoint.
const pgReleaseKeySQL = `DELETE FROM idempotency_keys
WHERE scope_user_id = $3 AND idem_key = $4 AND scope_endpoint = $5 AND id = $1 AND attempt = $2
	AND (status = 'failed' OR (status = 'in_flight' AND locked_until < now()))`

// releaseKey releases one stuck key for an operator
// (operator.Store.ReleaseKey) with one fenced DELETE, idempotent, so a lost
// connection is retried.
func (s *PostgresStore) releaseKey(ctx context.Context, f Fence) (bool, error) {
	var n int64
	err := retryConnLoss(ctx, func() error {
		tag, err := s.pool.Exec(ctx, pgReleaseKeySQL, f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, pgStoreError("release", err)
	}
	return n > 0, nil
}
