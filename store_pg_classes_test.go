package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestPostgresClassTable pins the SQLSTATE column of the class table
// (DESIGN-settled-r3 item 2, with 0A000 and 42704 from the Citus issue), and
// the errors without one, to their reasons.
func TestPostgresClassTable(t *testing.T) {
	t.Parallel()
	codes := map[string]string{
		// outage
		"08000": ReasonConnection, "08006": ReasonConnection, "08P01": ReasonConnection,
		"53000": ReasonConnection, "53100": ReasonConnection, "53200": ReasonConnection, "53400": ReasonConnection,
		"58000": ReasonConnection, "58030": ReasonConnection, "XX000": ReasonConnection, "XX001": ReasonConnection,
		"57P01": ReasonConnection, "57P02": ReasonConnection, "57P03": ReasonConnection,
		"57014": ReasonTimeout, // statement_timeout: a sent statement with no reply before its deadline
		// saturation
		"53300": ReasonTooManyConnections,
		// configuration
		"28000": ReasonAuth, "28P01": ReasonAuth, "3D000": ReasonAuth,
		"3F000": ReasonSchema, "42P01": ReasonSchema, "42703": ReasonSchema, "42P10": ReasonSchema,
		"0A000": ReasonSchema, "42704": ReasonSchema,
		"42501": ReasonPermission,
		// lock wait, contention, refused values
		"55P03": ReasonLockTimeout,
		"40001": ReasonConflict, "40P01": ReasonConflict,
		"22021": ReasonData, "22P02": ReasonData, "54000": ReasonData,
		// anything else
		"23505": ReasonOther, "23503": ReasonOther, "P0001": ReasonOther, "25006": ReasonOther, "57000": ReasonOther,
		"42601": ReasonOther, "0B000": ReasonOther,
	}
	for code, want := range codes {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		if got := pgReason(err); got != want {
			t.Errorf("SQLSTATE %s: reason %q, want %q", code, got, want)
		}
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"deadline", context.DeadlineExceeded, ReasonTimeout},
		{"EOF", io.ErrUnexpectedEOF, ReasonConnection},
		{"closed pool", errors.New("closed pool"), ReasonClosed},
		{"unknown", errors.New("something"), ReasonOther},
		{"acquire while connecting", &acquireError{reason: ReasonTimeout, err: context.DeadlineExceeded}, ReasonTimeout},
		{"acquire on a full pool", &acquireError{reason: ReasonPoolExhausted, err: context.DeadlineExceeded}, ReasonPoolExhausted},
	} {
		if got := pgReason(c.err); got != c.want {
			t.Errorf("%s: reason %q, want %q", c.name, got, c.want)
		}
	}
}
