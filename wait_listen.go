package idempotency

// The wait listener: one connection per store, outside its pool, that
// hears the records' wake-ups (PostgreSQL's LISTEN/NOTIFY, sent by the pgx
// store after a record with Fence.wake commits) and wakes the waiting
// duplicates of their rows. It starts with the first waiter, proves at
// every (re)connect that it hears a notification sent through the pool,
// and says so with a WARN when it cannot: the waiters then poll
// (waitPoll), which they do anyway.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// listenConn is the listener's connection (the pgx store's: store_pg_pool.go).
type listenConn interface {
	// next returns the payload of the next notification on the wake-ups'
	// channel (pgsql.ListenSQL): a row's id, or a listener's test.
	next(ctx context.Context) (string, error)
	close()
}

// Defaults of a listener's timing.
const (
	listenCheckTimeout = 5 * time.Second  // to connect, LISTEN and hear the test notification
	listenMaxBackoff   = 30 * time.Second // the longest pause between two connects
)

// listener hears wake-ups and wakes waiters (wakeups).
type listener struct {
	dial   func(ctx context.Context) (listenConn, error)   // connects and runs LISTEN
	notify func(ctx context.Context, payload string) error // sends a notification through the pool
	log    *slog.Logger
	check  time.Duration // bounds a connect with its self-check: listenCheckTimeout
	wakes  wakeups
	heard  atomic.Int64 // self-checks passed (tests)
	failed atomic.Int64 // connects that failed, their self-check included (tests)

	mu     sync.Mutex
	cancel context.CancelFunc // stops the listener; nil until it started
	done   chan struct{}      // closed once it stopped
	closed bool               // no listener any more: waiters poll
}

// watch registers a waiter for row id, starting the listener with the
// first one (Store.Watch).
func (l *listener) watch(id int64) (<-chan struct{}, func()) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, func() {}
	}
	if l.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel, l.done = cancel, make(chan struct{})
		go l.run(ctx)
	}
	l.mu.Unlock()
	return l.wakes.watch(id)
}

// close stops the listener and waits until its connection is closed.
func (l *listener) close() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.closed = true
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	l.wakes.wakeAll() // the waiters read again, and poll from now on
}

// run connects, hears, and connects again after every loss, pausing after
// a failed connect (doubling up to listenMaxBackoff), until ctx ends.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		c, err := l.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.failed.Add(1)
			l.log.WarnContext(ctx, "idempotency: the wait listener does not hear the records' wake-ups; duplicates that wait (RouteConfig.WaitInFlight) poll every 100ms. "+
				"Behind PgBouncer in transaction mode, give the store a direct ListenURL", "error", err, "retry_in", backoff.String())
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, listenMaxBackoff)
			continue
		}
		backoff = 100 * time.Millisecond
		l.wakes.wakeAll() // a wake-up sent while nothing listened is lost
		err = l.hear(ctx, c)
		c.close()
		if ctx.Err() == nil {
			l.log.WarnContext(ctx, "idempotency: the wait listener lost its connection; reconnecting", "error", err)
		}
	}
}

// connect dials a listening connection and proves it hears a notification
// sent through the pool, as the records' are, within l.check.
func (l *listener) connect(ctx context.Context) (listenConn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.check)
	defer cancel()
	c, err := l.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect and LISTEN: %w", err)
	}
	token := "check " + uuid.NewString()
	if err := l.notify(ctx, token); err != nil {
		c.close()
		return nil, fmt.Errorf("send the test notification through the pool: %w", err)
	}
	for {
		p, err := c.next(ctx)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("the test notification did not arrive within %v: %w", l.check, err)
		}
		if p == token {
			l.heard.Add(1)
			return c, nil
		}
		l.dispatch(p)
	}
}

// hear wakes the waiters of every row it hears of, until c fails or ctx
// ends.
func (l *listener) hear(ctx context.Context, c listenConn) error {
	for {
		p, err := c.next(ctx)
		if err != nil {
			return err
		}
		l.dispatch(p)
	}
}

// dispatch wakes the waiters of the row a payload names; another payload
// (another listener's test) is ignored.
func (l *listener) dispatch(payload string) {
	if id, err := strconv.ParseInt(payload, 10, 64); err == nil {
		l.wakes.wake(id)
	}
}
