package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"strconv"
	"syscall"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/sqlstate"
)

// The class table of store errors, for
// database/sql: the server's error code decides where there is one; a
// connection that failed or a sent statement that got no reply in time is
// an outage (the only class a fail-open route bypasses on); a wait for a
// pooled connection that ran out with every connection in use is
// saturation.

// errInvalidConn is go-sql-driver/mysql's ErrInvalidConn, matched by its
// text: this package does not import the driver.
const errInvalidConn = "invalid connection"

// serverCode returns the server's error code inside err: a MySQL error
// number (go-sql-driver's *MySQLError, read by reflection), or a
// PostgreSQL SQLSTATE (pgx's *pgconn.PgError and lib/pq's *pq.Error both
// have SQLState).
func serverCode(err error) (string, bool) {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState(), true
	}
	var n uint16
	found := false
	walk(err, func(e error) bool {
		n, found = mysqlNumber(e)
		return found
	})
	return strconv.Itoa(int(n)), found
}

// walk calls f on err and every error it wraps, depth first, until f
// returns true.
func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	}
	return false
}

// mysqlNumber reads Number from a *mysql.MySQLError.
func mysqlNumber(err error) (uint16, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "MySQLError" {
		return 0, false
	}
	f := v.Elem().FieldByName("Number")
	if !f.IsValid() || f.Kind() != reflect.Uint16 {
		return 0, false
	}
	return uint16(f.Uint()), true
}

// mysqlReason is the MySQL/MariaDB column of the shared class table.
func mysqlReason(code string) string {
	n, err := strconv.ParseUint(code, 10, 16)
	if err != nil {
		return idempotency.ReasonOther
	}
	return sqlstate.MySQL(uint16(n))
}

// pgReason is the PostgreSQL column of the shared class table, the one
// the pgx store reads.
func pgReason(code string) string { return sqlstate.Postgres(code) }

// acquireError is a wait for a pooled connection that failed, with the
// reason the pool's state gave it then.
type acquireError struct {
	reason string
	err    error
}

func (e *acquireError) Error() string { return "no pooled connection: " + e.err.Error() }
func (e *acquireError) Unwrap() error { return e.err }

// reason classifies err for the store's dialect.
func (s *Store) reason(err error) string {
	var acq *acquireError
	var netErr net.Error
	code, coded := serverCode(err)
	switch {
	case errors.As(err, &acq):
		return acq.reason
	case errors.Is(err, sql.ErrConnDone) || err.Error() == "sql: database is closed":
		return idempotency.ReasonClosed
	case coded:
		return s.d.codeReason(code)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr) && netErr.Timeout():
		return idempotency.ReasonTimeout // a sent statement with no reply in time
	case errors.As(err, &netErr), errors.Is(err, driver.ErrBadConn), isInvalidConn(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return idempotency.ReasonConnection
	}
	return idempotency.ReasonOther
}

// isInvalidConn reports go-sql-driver's ErrInvalidConn anywhere in err.
func isInvalidConn(err error) bool {
	return walk(err, func(e error) bool { return e.Error() == errInvalidConn })
}

// isConnLoss reports an error after which the connection is gone.
func (s *Store) isConnLoss(err error) bool {
	r := s.reason(err)
	return r == idempotency.ReasonConnection || r == idempotency.ReasonTimeout || r == idempotency.ReasonClosed
}

// storeError wraps err as the *idempotency.StoreError of op.
func (s *Store) storeError(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *idempotency.StoreError
	if errors.As(err, &se) {
		return err
	}
	return &idempotency.StoreError{Op: op, Reason: s.reason(err), Err: err}
}

// hasCode reports whether err carries one of the server codes.
func hasCode(err error, codes ...string) bool {
	c, ok := serverCode(err)
	if !ok {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}
