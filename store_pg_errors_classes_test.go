package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/internal/sqlstate"
)

// TestPostgresClassTable pins the SQLSTATE column of the class table
// (DESIGN-settled-r3 item 2, with 0A000 and 42704 from the Citus issue), and
// the errors without one, to their reasons.
func TestPostgresClassTable(t *testing.T) {
	t.Parallel()
	codes := map[string]string{
		// a server's answer of class 08: a node behind it (Citus), never read from the message
		"08000": ReasonRemoteNode, "08006": ReasonRemoteNode, "08P01": ReasonRemoteNode, "08001": ReasonRemoteNode,
		// outage
		"53000": ReasonConnection, "53100": ReasonConnection, "53200": ReasonConnection, "53400": ReasonConnection,
		"58000": ReasonConnection, "58030": ReasonConnection, "XX000": ReasonConnection, "XX001": ReasonConnection,
		"57P01": ReasonConnection, "57P02": ReasonConnection, "57P03": ReasonConnection,
		"57014": ReasonStatementTimeout, // the server answered: a lock wait or a slow statement, never an outage
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
	} {
		if got := pgReason(c.err); got != c.want {
			t.Errorf("%s: reason %q, want %q", c.name, got, c.want)
		}
	}
}

// TestOneClassTable: the pgx store and sqlstore's PostgreSQL dialect read
// one SQLSTATE table (internal/sqlstate), whose reasons are the Reason
// constants; 40P01 is retryable as 40001 is.
func TestOneClassTable(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]string{
		sqlstate.Connection: ReasonConnection, sqlstate.TooManyConnections: ReasonTooManyConnections,
		sqlstate.Auth: ReasonAuth, sqlstate.Schema: ReasonSchema, sqlstate.Permission: ReasonPermission,
		sqlstate.LockTimeout: ReasonLockTimeout, sqlstate.StatementTimeout: ReasonStatementTimeout,
		sqlstate.RemoteNode: ReasonRemoteNode, sqlstate.Conflict: ReasonConflict, sqlstate.Data: ReasonData,
		sqlstate.Other: ReasonOther,
	} {
		if got != want {
			t.Errorf("internal/sqlstate reason %q, the root's constant %q", got, want)
		}
	}
	for _, code := range []string{"40001", "40P01"} {
		if err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}); !isRetryable(err) {
			t.Errorf("SQLSTATE %s is not retried", code)
		}
	}
	if isRetryable(&pgconn.PgError{Code: "23505"}) {
		t.Error("23505 is retried")
	}
}

// TestOneSQLStateFile: the SQLSTATE 57014 is written in exactly one
// non-test Go file of the module (DESIGN-settled-r4 item 12), the shared
// table's: a second copy is how the two stores drifted.
func TestOneSQLStateFile(t *testing.T) {
	t.Parallel()
	var found []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() && path != ".":
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("57014")) {
				found = append(found, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0] != filepath.Join("internal", "sqlstate", "sqlstate.go") {
		t.Errorf("57014 is written in %v, want internal/sqlstate/sqlstate.go only", found)
	}
}

// unsentErr is a deadline that passed before the statement left, as pgx
// reports it (SafeToRetry).
type unsentErr struct{}

func (unsentErr) Error() string     { return "timeout: context deadline exceeded" }
func (unsentErr) SafeToRetry() bool { return true }
func (unsentErr) Unwrap() error     { return context.DeadlineExceeded }

// TestPoolWaitsArePoolExhausted: every wait on the pool is pool_exhausted,
// whichever way it surfaced (DESIGN-settled-r4 item 4; of 195 saturation
// 503s, 146 were labelled other): an acquire that ran out while the pool
// was still opening connections, one with room in the pool, one with
// every connection in use, and a deadline that passed before the
// statement left.
func TestPoolWaitsArePoolExhausted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ inUse, opening, max int32 }{{0, 1, 4}, {3, 1, 4}, {4, 0, 4}, {1, 0, 4}, {0, 0, 4}} {
		acq := &acquireError{err: context.DeadlineExceeded, inUse: c.inUse, opening: c.opening, max: c.max}
		if got := pgReason(fmt.Errorf("claim: %w", acq)); got != ReasonPoolExhausted {
			t.Errorf("acquire with %d of %d in use, %d opening: %q, want pool_exhausted", c.inUse, c.max, c.opening, got)
		}
	}
	if got := pgReason(fmt.Errorf("claim: %w", unsentErr{})); got != ReasonPoolExhausted {
		t.Errorf("a deadline before the statement left: %q, want pool_exhausted", got)
	}
}

// TestProbeVerdicts: what the outage probe makes of what it got
// (DESIGN-settled-r4 item 4): only no answer, a network error or a server
// error of class 08 (PgBouncer's own for a server it cannot reach) or
// 57P01-57P03 is a failed probe; a refused login is auth or
// too_many_connections; any other answer means the database answered.
func TestProbeVerdicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want string // "" for nil
	}{
		{"answered", nil, ""},
		{"08P01 (PgBouncer: no server)", &pgconn.PgError{Code: "08P01"}, ReasonConnection},
		{"08006", &pgconn.PgError{Code: "08006"}, ReasonConnection},
		{"57P03 cannot_connect_now", &pgconn.PgError{Code: "57P03"}, ReasonConnection},
		{"57P01 admin_shutdown", &pgconn.PgError{Code: "57P01"}, ReasonConnection},
		{"28P01 password", &pgconn.PgError{Code: "28P01"}, ReasonAuth},
		{"3D000 no database", &pgconn.PgError{Code: "3D000"}, ReasonAuth},
		{"53300 too many", &pgconn.PgError{Code: "53300"}, ReasonTooManyConnections},
		{"42P01: the server answered", &pgconn.PgError{Code: "42P01"}, ""},
		{"57014: the server answered", &pgconn.PgError{Code: "57014"}, ""},
		{"no answer in time", fmt.Errorf("connect: %w", context.DeadlineExceeded), ReasonConnection},
		{"refused", refusedConnect(t), ReasonConnection},
		{"reset", io.ErrUnexpectedEOF, ReasonConnection},
		{"the caller gave up", context.Canceled, ReasonOther},
		{"something else", errors.New("something"), ReasonOther},
	} {
		got := postgresClasses.probeVerdict(c.err)
		if c.want == "" {
			if got != nil {
				t.Errorf("%s: %v, want nil", c.name, got)
			}
			continue
		}
		var se *StoreError
		if !errors.As(got, &se) || se.Reason != c.want || se.Op != "probe" {
			t.Errorf("%s: %v, want a probe StoreError with reason %s", c.name, got, c.want)
		}
	}
}

// refusedConnect is pgx's error for a connect to a port nothing listens on.
func refusedConnect(t *testing.T) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, "postgres://u@127.0.0.1:1/db?sslmode=disable")
	if err == nil {
		c.Close(ctx)
		t.Fatal("a connect to port 1 succeeded")
	}
	return err
}
