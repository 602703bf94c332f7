package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"reflect"
	"strconv"
	"unsafe"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/sqlstate"
)

// Probe implements idempotency.Store: a new connection from the
// *sql.DB's own connector (the pool's settings), outside the pool, runs
// SELECT 1 (DO 0 on MySQL) and is closed. The answer is not awaited past
// ctx: lib/pq cannot bound a read once connected, so its call is left to
// end with its socket.
func (s *Store) Probe(ctx context.Context) error {
	return s.probes.Do(ctx, func(ctx context.Context) error {
		done := make(chan error, 1)
		go func() { done <- s.dialProbe(ctx) }()
		select {
		case err := <-done:
			return s.probeVerdict(err)
		case <-ctx.Done():
			return s.probeVerdict(ctx.Err())
		}
	})
}

// errNoConnector is the probe's error when the *sql.DB's connector cannot
// be read: 503, never a bypass.
var errNoConnector = errors.New("sqlstore: the *sql.DB's connector cannot be read: the outage probe cannot open a connection")

// dialProbe opens the probe's connection and runs its statement.
func (s *Store) dialProbe(ctx context.Context) error {
	c := connector(s.db)
	if c == nil {
		return errNoConnector
	}
	conn, err := c.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stmt := "SELECT 1"
	if s.d.name == MySQL {
		stmt = "DO 0"
	}
	if ex, ok := conn.(driver.ExecerContext); ok {
		if _, err = ex.ExecContext(ctx, stmt, nil); !errors.Is(err, driver.ErrSkip) {
			return err
		}
	}
	st, err := conn.Prepare(stmt)
	if err != nil {
		return err
	}
	defer st.Close()
	//lint:ignore SA1019 a driver without ExecerContext has only Stmt.Exec
	_, err = st.Exec(nil)
	return err
}

// connector returns the driver.Connector db opens its connections with:
// sql.Open's DSN connector or sql.OpenDB's. database/sql keeps it
// unexported, so it is read by reflection; nil when it cannot be.
func connector(db *sql.DB) driver.Connector {
	f := reflect.ValueOf(db).Elem().FieldByName("connector")
	if !f.IsValid() || f.Type() != reflect.TypeFor[driver.Connector]() || !f.CanAddr() {
		return nil
	}
	c, _ := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(driver.Connector)
	return c
}

// probeVerdict is the outage probe's verdict on what it got: nil when the
// database answered; ReasonConnection when it could not be reached (a
// network error, no answer in time, a server error of the connection
// classes); ReasonAuth or ReasonTooManyConnections for a refused login;
// ReasonOther for anything else.
func (s *Store) probeVerdict(err error) error {
	if err == nil {
		return nil
	}
	reason := idempotency.ReasonOther
	code, coded := serverCode(err)
	switch r := s.reason(err); {
	case errors.Is(err, context.Canceled): // the caller gave up: no evidence either way
	case coded:
		if reason = s.probeCode(code); reason == "" {
			return nil // the database answered
		}
	case r == idempotency.ReasonConnection, r == idempotency.ReasonTimeout, r == idempotency.ReasonPoolExhausted:
		reason = idempotency.ReasonConnection // no answer, whichever way it failed
	}
	return &idempotency.StoreError{Op: "probe", Reason: reason, Err: err}
}

// probeCode is the probe's verdict on a server's code, "" when it
// answered.
func (s *Store) probeCode(code string) string {
	if s.d.name == PostgreSQL {
		return sqlstate.PostgresProbe(code)
	}
	n, err := strconv.ParseUint(code, 10, 16)
	if err != nil {
		return ""
	}
	return sqlstate.MySQLProbe(uint16(n))
}
