package idempotency

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/internal/sqlstate"
)

// pgRetries bounds how many times a statement is run again when it read no
// row because of a concurrent commit, or failed with a serialization failure.
const pgRetries = 5

// retrySerialization runs f again, a bounded number of times, while it fails
// with a serialization failure or a deadlock (possible when the host runs
// its sessions at SERIALIZABLE or REPEATABLE READ); the failed statement
// changed nothing.
func retrySerialization(ctx context.Context, f func() error) error {
	var err error
	for range pgRetries {
		if err = f(); !isRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// isRetryable reports a serialization failure or a deadlock.
func isRetryable(err error) bool {
	if err == nil {
		return false // without errors.As, whose target escapes
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && sqlstate.PostgresRetryable(pgErr.Code)
}

// pgOwnerError translates err like pgStoreError but keeps ErrNotOwner as it
// is.
func pgOwnerError(op string, err error) error {
	if err == nil || errors.Is(err, ErrNotOwner) {
		return err
	}
	return pgStoreError(op, err)
}

// pgStoreError wraps a pgx error in a *StoreError for op.
func pgStoreError(op string, err error) error {
	return &StoreError{Op: op, Reason: pgReason(err), Err: explainPooler(err)}
}

// pgReason classifies a pgx error by the class table.
func pgReason(err error) string { return postgresClasses.reason(err) }

// postgresClasses is the class table's PostgreSQL column.
var postgresClasses = dialect{code: pgCode, codeReason: pgCodeReason,
	unsent: pgconn.SafeToRetry, linkFailed: pgLinkFailed, closed: pgPoolClosed, probeCode: sqlstate.PostgresProbe}

// pgLinkFailed reports pgx's own connection errors: a connect that failed
// without a server's answer (refused, TLS), or a connection pgx closed.
func pgLinkFailed(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed)
}

// pgPoolClosed reports a closed pool: pgxpool returns puddle's
// ErrClosedPool, a plain error, unwrapped or wrapped with a prefix.
func pgPoolClosed(err error) bool {
	return err.Error() == "closed pool" || strings.HasSuffix(err.Error(), ": closed pool")
}

// pgCode returns the SQLSTATE the server answered with, if any, also
// inside a *pgconn.ConnectError: a refused login is classified by its code.
func pgCode(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, true
	}
	return "", false
}

// pgCodeReason classifies a SQLSTATE by the shared table.
func pgCodeReason(code string) string { return sqlstate.Postgres(code) }
