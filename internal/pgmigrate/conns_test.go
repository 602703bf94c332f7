package pgmigrate

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
)

// TestAbortedSetRefusesConnections: once the wait was abandoned (abort), a
// connection asked for is refused, and one that was connecting meanwhile is
// closed and refused. New's context can end before golang-migrate has taken
// its connection (a slow connect on a loaded machine): abort then found
// nothing to cancel, golang-migrate connected anyway and waited for a held
// migration lock without bound (CI: 15 minutes in
// TestPostgresMigrations/LockWaitEndsWithContext).
func TestAbortedSetRefusesConnections(t *testing.T) {
	t.Parallel()
	t.Run("before", func(t *testing.T) {
		set := &connSet{conns: make(map[*ownedConn]struct{})}
		set.abort()
		fc := &fakeConnector{}
		if c, err := (connector{Connector: fc, set: set}).Connect(t.Context()); !errors.Is(err, errAborted) || fc.calls != 0 {
			t.Fatalf("Connect after abort: %v, %v, %d connects; want errAborted and none", c, err, fc.calls)
		}
	})
	t.Run("while connecting", func(t *testing.T) {
		set := &connSet{conns: make(map[*ownedConn]struct{})}
		fc := &fakeConnector{during: set.abort}
		c, err := (connector{Connector: fc, set: set}).Connect(t.Context())
		if !errors.Is(err, errAborted) || !fc.conn.closed || len(set.conns) != 0 {
			t.Fatalf("Connect aborted meanwhile: %v, %v, closed %v, %d held; want errAborted, the connection closed, none held",
				c, err, fc.conn.closed, len(set.conns))
		}
	})
}

// fakeConnector connects to nothing: it counts its calls, runs during
// before it returns, and returns conn.
type fakeConnector struct {
	calls  int
	during func()
	conn   fakeConn
}

func (f *fakeConnector) Connect(context.Context) (driver.Conn, error) {
	f.calls++
	if f.during != nil {
		f.during()
	}
	return &f.conn, nil
}

func (f *fakeConnector) Driver() driver.Driver { return nil }

type fakeConn struct{ closed bool }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.ErrUnsupported }
func (c *fakeConn) Close() error                        { c.closed = true; return nil }
func (c *fakeConn) Begin() (driver.Tx, error)           { return nil, errors.ErrUnsupported }
