package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// The class table of store errors (DESIGN-settled-r3 item 2): what a
// failed store call means for a fail-open route. Only an outage, evidence
// that the database itself failed, is a bypass (claimPolicy). A dialect
// supplies one database's column; the pool's state, deadlines and the
// network are classified alike for every database.

// dialect is one database's column of the class table.
type dialect struct {
	code       func(error) (string, bool) // the server's error code inside err
	codeReason func(string) string        // the reason of a server's error code
	unsent     func(error) bool           // err reports that nothing was sent
	linkFailed func(error) bool           // the driver's own connection errors (refused, TLS, closed)
	closed     func(error) bool           // the pool or handle was closed
}

// reason classifies err: the acquire's verdict, a closed store, the
// server's code, then how the call died on its way.
func (d dialect) reason(err error) string {
	var acq *acquireError
	var netErr net.Error
	code, coded := d.code(err)
	switch {
	case errors.As(err, &acq):
		return acq.reason
	case d.closed(err):
		return ReasonClosed
	case coded:
		return d.codeReason(code)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr) && netErr.Timeout():
		if d.unsent(err) {
			// The deadline passed before the statement left: the time went
			// to the acquire or to earlier attempts, not to the database.
			return ReasonOther
		}
		return ReasonTimeout // a sent statement with no reply before the deadline
	case errors.As(err, &netErr), d.linkFailed(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return ReasonConnection
	}
	return ReasonOther
}

// acquireError is a failed wait for a pooled connection, classified when
// it failed, from the pool's state then: a wait that ran out while the pool
// was opening a connection is an outage (the database does not answer a
// connect); one with every connection in use and none being opened is
// saturation, and the database was never asked.
type acquireError struct {
	reason              string // ReasonTimeout, ReasonPoolExhausted or ReasonOther
	err                 error
	inUse, opening, max int32
}

func (e *acquireError) Error() string {
	return fmt.Sprintf("no pooled connection before the deadline (%d of %d in use, %d being opened): %v",
		e.inUse, e.max, e.opening, e.err)
}

func (e *acquireError) Unwrap() error { return e.err }

// acquireReason classifies a wait for a connection that ran out.
func acquireReason(inUse, opening, max int32) string {
	switch {
	case opening > 0:
		return ReasonTimeout
	case inUse >= max:
		return ReasonPoolExhausted
	}
	// Room in the pool and nothing being opened: a connection came free
	// just as the wait ended (saturation), or the pool's ping of an idle
	// one hung (an outage). They look alike, and a bypass needs evidence.
	return ReasonOther
}
