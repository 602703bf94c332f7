package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// The class table of store errors (DESIGN-settled-r4 items 4 and 5): what
// a failed store call means for a fail-open route. Only a connection
// failure or a sent statement's timeout makes the route run the outage
// probe, and only a failed probe is a bypass (claimFailed). The server's
// codes are classified by internal/sqlstate, shared by every store; the
// pool, deadlines and the network are classified alike for every database.

// dialect is one database's column of the class table.
type dialect struct {
	code       func(error) (string, bool) // the server's error code inside err
	codeReason func(string) string        // the reason of a server's error code
	unsent     func(error) bool           // err reports that nothing was sent
	linkFailed func(error) bool           // the driver's own connection errors (refused, TLS, closed)
	closed     func(error) bool           // the pool or handle was closed
	probeCode  func(string) string        // the outage probe's verdict on a server's code; "" when it answered
}

// reason classifies err: the acquire's verdict, a closed store, the
// server's code, then how the call died on its way.
func (d dialect) reason(err error) string {
	var acq *acquireError
	var netErr net.Error
	code, coded := d.code(err)
	switch {
	case errors.As(err, &acq):
		return ReasonPoolExhausted
	case d.closed(err):
		return ReasonClosed
	case coded:
		return d.codeReason(code)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr) && netErr.Timeout():
		if d.unsent(err) {
			// The deadline passed before the statement left: the time went
			// to the acquire or to earlier attempts, a wait on the pool.
			return ReasonPoolExhausted
		}
		return ReasonTimeout // a sent statement with no reply before the deadline
	case errors.As(err, &netErr), d.linkFailed(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return ReasonConnection
	}
	return ReasonOther
}

// probeVerdict is the outage probe's verdict on what it got (Store.Probe):
// nil when the database answered, ReasonConnection when it could not be
// reached, ReasonAuth or ReasonTooManyConnections when it refused the
// login, and ReasonOther for anything else (503, never a bypass).
func (d dialect) probeVerdict(err error) error {
	if err == nil {
		return nil
	}
	reason := ReasonOther
	code, coded := d.code(err)
	switch r := d.reason(err); {
	case errors.Is(err, context.Canceled): // the caller gave up: no evidence either way
	case coded:
		if reason = d.probeCode(code); reason == "" {
			return nil // the database answered
		}
	case r == ReasonConnection, r == ReasonTimeout, r == ReasonPoolExhausted:
		reason = ReasonConnection // no answer, whichever way it failed
	}
	return &StoreError{Op: "probe", Reason: reason, Err: err}
}

// acquireError is a failed wait for a pooled connection, with the pool's
// state when it failed, for the log. Whatever that state, it is
// pool_exhausted (DESIGN-settled-r4 item 4): every connection in use is
// saturation, and a pool still opening a connection is no evidence of an
// outage either; only the outage probe is.
type acquireError struct {
	err                 error
	inUse, opening, max int32
}

func (e *acquireError) Error() string {
	return fmt.Sprintf("no pooled connection before the deadline (%d of %d in use, %d being opened): %v",
		e.inUse, e.max, e.opening, e.err)
}

func (e *acquireError) Unwrap() error { return e.err }
