package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency"
)

// MySQLError stands in for go-sql-driver's *MySQLError, read by its type
// name and Number field.
type MySQLError struct{ Number uint16 }

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d", e.Number) }

// TestClassTableSharedWithPgx: sqlstore's PostgreSQL dialect classifies a
// SQLSTATE as the pgx store does (one table, internal/sqlstate): 57014 is a
// statement timeout on both, a server's class 08 is a remote node's, and
// 40P01 restarts a claim as 40001 does. MySQL's statement timeouts (1969,
// 3024) are the same class.
func TestClassTableSharedWithPgx(t *testing.T) {
	t.Parallel()
	pg, my := &Store{d: pgDialect}, &Store{d: mysqlDialect}
	for code, want := range map[string]string{
		"57014": idempotency.ReasonStatementTimeout, "08006": idempotency.ReasonRemoteNode,
		"57P01": idempotency.ReasonConnection, "53300": idempotency.ReasonTooManyConnections,
		"28P01": idempotency.ReasonAuth, "40P01": idempotency.ReasonConflict, "40001": idempotency.ReasonConflict,
		"55P03": idempotency.ReasonLockTimeout, "42P01": idempotency.ReasonSchema,
	} {
		if got := pg.reason(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})); got != want {
			t.Errorf("SQLSTATE %s: %q, want %q", code, got, want)
		}
	}
	for _, code := range []string{"40001", "40P01"} {
		if !hasCode(&pgconn.PgError{Code: code}, pgDialect.restart...) {
			t.Errorf("SQLSTATE %s does not restart a claim", code)
		}
	}
	for n, want := range map[uint16]string{
		1969: idempotency.ReasonStatementTimeout, 3024: idempotency.ReasonStatementTimeout,
		1205: idempotency.ReasonLockTimeout, 1213: idempotency.ReasonConflict, 1045: idempotency.ReasonAuth,
		2013: idempotency.ReasonConnection, 1040: idempotency.ReasonTooManyConnections,
	} {
		if got := my.reason(fmt.Errorf("wrapped: %w", &MySQLError{Number: n})); got != want {
			t.Errorf("MySQL %d: %q, want %q", n, got, want)
		}
	}
}

// TestPoolWaitIsPoolExhausted: a wait for a pooled connection that ran
// out is pool_exhausted whatever the pool's state (DESIGN-settled-r4 item
// 4): with room in the pool the time went to opening a connection, which
// is not evidence of an outage either.
func TestPoolWaitIsPoolExhausted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := &Store{d: pgDialect, db: openUnreachable(t)}
	_, err := s.conn(ctx)
	if got := s.reason(err); got != idempotency.ReasonPoolExhausted {
		t.Fatalf("a pool wait that ran out: %q (%v), want pool_exhausted", got, err)
	}
}

// blockingConnector is a driver.Connector whose connects wait for their
// context: a database that never answers a connect.
type blockingConnector struct{}

func (blockingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (blockingConnector) Driver() driver.Driver { return nil }

// openUnreachable is a *sql.DB whose every connect waits for its context.
func openUnreachable(t *testing.T) *sql.DB {
	db := sql.OpenDB(blockingConnector{})
	t.Cleanup(func() { db.Close() })
	return db
}

// TestProbeVerdicts: the outage probe's verdicts on both dialects' codes:
// only no answer, a network error or a connection-class code is a failed
// probe; a refused login is auth or too_many_connections; any other
// answer means the database answered.
func TestProbeVerdicts(t *testing.T) {
	t.Parallel()
	pg, my := &Store{d: pgDialect}, &Store{d: mysqlDialect}
	for _, c := range []struct {
		name string
		s    *Store
		err  error
		want string // "" for nil
	}{
		{"pg 08P01", pg, &pgconn.PgError{Code: "08P01"}, idempotency.ReasonConnection},
		{"pg 57P03", pg, &pgconn.PgError{Code: "57P03"}, idempotency.ReasonConnection},
		{"pg 28P01", pg, &pgconn.PgError{Code: "28P01"}, idempotency.ReasonAuth},
		{"pg 53300", pg, &pgconn.PgError{Code: "53300"}, idempotency.ReasonTooManyConnections},
		{"pg 57014 answered", pg, &pgconn.PgError{Code: "57014"}, ""},
		{"mysql 2013", my, &MySQLError{Number: 2013}, idempotency.ReasonConnection},
		{"mysql 1045", my, &MySQLError{Number: 1045}, idempotency.ReasonAuth},
		{"mysql 1049", my, &MySQLError{Number: 1049}, idempotency.ReasonAuth},
		{"mysql 1040", my, &MySQLError{Number: 1040}, idempotency.ReasonTooManyConnections},
		{"mysql 1205 answered", my, &MySQLError{Number: 1205}, ""},
		{"no answer in time", my, context.DeadlineExceeded, idempotency.ReasonConnection},
		{"bad connection", my, driver.ErrBadConn, idempotency.ReasonConnection},
		{"the caller gave up", pg, context.Canceled, idempotency.ReasonOther},
		{"no connector", pg, errNoConnector, idempotency.ReasonOther},
	} {
		got := c.s.probeVerdict(c.err)
		var se *idempotency.StoreError
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%s: %v, want nil", c.name, got)
		case c.want != "" && (!errors.As(got, &se) || se.Reason != c.want || se.Op != "probe"):
			t.Errorf("%s: %v, want a probe StoreError with reason %s", c.name, got, c.want)
		}
	}
}
