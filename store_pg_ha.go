package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// poolerHint is what a prepared-statement error from a transaction-mode
// pooler means.
const poolerHint = "prepared statements do not survive between transactions: behind a transaction-mode pooler " +
	"(PgBouncer pool_mode=transaction) set default_query_exec_mode=exec or cache_describe in the connection string"

// explainPooler adds poolerHint to the errors pgx's default statement cache
// gets behind a transaction-mode pooler, where each transaction may run on
// another server connection: a named statement that already exists there
// (42P05, duplicate_prepared_statement) or is missing (26000,
// invalid_sql_statement_name). Other errors are returned as they are.
func explainPooler(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		return fmt.Errorf("%w (%s)", err, poolerHint)
	}
	return err
}

// retryConnLoss runs f, then once more when it failed because its
// connection was lost or shut down (isConnLoss): after a failover the pool
// still holds connections to the old primary, and pgx checks
// target_session_attrs only when it opens a connection, never retrying the
// statement in flight. Only claims, reads and ReleaseOwner go through it.
// When the lost attempt of a claim had committed, the retry finds that
// row: with an owner token (ClaimRequest.Owner) it recognises the row as
// its own and wins it (pgsql.ClaimSQL); without one it reads the row as
// someone else's claim in flight, and the request answers as a concurrent
// duplicate would (409) although nothing ran. A takeover whose
// reply was lost reads as lost (no row matches its fence any more); the
// caller's next Claim with the same token then wins the row.
//
// f is retried as retrySerialization does too.
func retryConnLoss(ctx context.Context, f func() error) error {
	err := retrySerialization(ctx, f)
	if isConnLoss(ctx, err) {
		err = retrySerialization(ctx, f)
	}
	return err
}

// isConnLoss reports an error from a lost, refused or shut-down connection
// (SQLSTATE class 08, 57P01 admin_shutdown and its kin, pgx's closed
// connection and network errors: pgReason's ReasonConnection and
// ReasonRemoteNode) while ctx
// still has time. A deadline that fired is never retried.
func isConnLoss(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	r := pgReason(err)
	return r == ReasonConnection || r == ReasonRemoteNode
}
