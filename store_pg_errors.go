package idempotency

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

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
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
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
	unsent: pgconn.SafeToRetry, linkFailed: pgLinkFailed, closed: pgPoolClosed}

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

// pgCodeReason classifies a SQLSTATE.
func pgCodeReason(code string) string {
	switch code {
	case "53300": // too_many_connections: saturation, the server answered
		return ReasonTooManyConnections
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return ReasonConnection
	case "57014": // query_canceled: statement_timeout, a sent statement with no reply in time
		return ReasonTimeout
	case "3D000": // invalid_catalog_name: the connection names no such database
		return ReasonAuth
	case "3F000", // invalid_schema_name
		"42P01", // undefined_table
		"42703", // undefined_column
		"42P10", // invalid_column_reference: the unique constraint ON CONFLICT needs is missing
		"42704", // undefined_object: a setting a Citus worker does not know
		"0A000": // feature_not_supported: a statement Citus cannot distribute
		return ReasonSchema
	case "42501": // insufficient_privilege
		return ReasonPermission
	case "55P03": // lock_not_available: lock_timeout ran out (DDL, a migration)
		return ReasonLockTimeout
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return ReasonConflict
	}
	switch code[:min(2, len(code))] {
	case "08", "53", "58", "XX": // connection, resources, system, internal
		return ReasonConnection
	case "28": // invalid_authorization_specification: a refused login
		return ReasonAuth
	case "22", // data_exception: a value the column cannot hold
		"54": // program_limit_exceeded: e.g. an index row too large
		return ReasonData
	}
	return ReasonOther
}
