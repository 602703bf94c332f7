package idempotency

import (
	"context"
	"errors"
	"io"
	"net"
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

// pgReason classifies a pgx error as one of the Reason constants.
func pgReason(err error) string {
	var (
		pgErr      *pgconn.PgError
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	// The context first: pgx reports an interrupted call as whatever it
	// was doing (connecting, reading), wrapping the context's error.
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), pgconn.Timeout(err):
		return ReasonTimeout
	case err.Error() == "closed pool" || strings.HasSuffix(err.Error(), ": closed pool"):
		// pgxpool returns puddle's ErrClosedPool, a plain error, unwrapped.
		return ReasonClosed
	case errors.As(err, &connectErr):
		return ReasonConnection
	case errors.As(err, &pgErr):
		return pgCodeReason(pgErr.Code)
	case errors.As(err, &netErr):
		if netErr.Timeout() {
			return ReasonTimeout
		}
		return ReasonConnection
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed):
		return ReasonConnection
	}
	return ReasonOther
}

// pgCodeReason classifies a SQLSTATE.
func pgCodeReason(code string) string {
	switch code {
	case "42P01", // undefined_table
		"42703", // undefined_column
		"42P10", // invalid_column_reference: the unique constraint ON CONFLICT needs is missing
		"3F000": // invalid_schema_name
		return ReasonSchema
	case "42501": // insufficient_privilege
		return ReasonPermission
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return ReasonConflict
	case "57014", // query_canceled: statement_timeout, or a cancel request
		"55P03": // lock_not_available: lock_timeout
		return ReasonTimeout
	case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
		"53300": // too_many_connections
		return ReasonConnection
	}
	switch {
	case strings.HasPrefix(code, "08"): // connection_exception
		return ReasonConnection
	case strings.HasPrefix(code, "22"), // data_exception: a value the column cannot hold
		strings.HasPrefix(code, "54"): // program_limit_exceeded: e.g. an index row too large
		return ReasonData
	}
	return ReasonOther
}
