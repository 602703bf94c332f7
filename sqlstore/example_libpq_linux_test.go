package sqlstore_test

import (
	"context"
	"database/sql"
	"log"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/lib/pq"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h; unix.TCP_USER_TIMEOUT
// in golang.org/x/sys), which package syscall does not name.
const tcpUserTimeout = 0x12

// userTimeoutDialer is lib/pq's Dialer with TCP_USER_TIMEOUT set on every
// connection: data the server has not acknowledged within the timeout
// fails the socket, so a call on a link that went dark returns (and its
// connection is closed) instead of waiting for the kernel's retransmission
// limit, about 15 minutes.
type userTimeoutDialer struct{ d net.Dialer }

func newUserTimeoutDialer(timeout time.Duration) userTimeoutDialer {
	return userTimeoutDialer{net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(timeout.Milliseconds()))
			})
			if err != nil {
				return err
			}
			return serr
		}}}
}

func (u userTimeoutDialer) Dial(network, address string) (net.Conn, error) {
	return u.d.Dial(network, address)
}

func (u userTimeoutDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	d := u.d
	d.Timeout = timeout
	return d.Dial(network, address)
}

func (u userTimeoutDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return u.d.DialContext(ctx, network, address)
}

// A store on lib/pq (Linux). lib/pq bounds no read once connected: at a
// deadline it asks the server to cancel and goes on waiting, so on a link
// that went dark its call never returns. The store still answers by its
// deadlines (the call is left to finish on its own), but the connection
// is freed only when the socket fails: build the pool with a dialer that
// sets TCP_USER_TIMEOUT to the store timeout. pgx's stdlib needs none of
// this: it closes the connection at a deadline. Compile-only: it needs a
// database.
func Example_libpq() {
	ctx := context.Background()
	storeTimeout := 2 * time.Second // Config.StoreTimeout
	connector, err := pq.NewConnector(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	connector.Dialer(newUserTimeoutDialer(storeTimeout))
	db := sql.OpenDB(connector)
	store, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(store, idempotency.Config{StoreTimeout: storeTimeout})
	if err != nil {
		log.Fatal(err)
	}
	_ = mw.MustRoute(idempotency.RouteConfig{Transactional: true})
}
