package idempotency_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresTxBlackholeKeepsThePoolFree: a transactional route's claim
// or commit cut short by its deadline on a black-holed network leaves a
// connection pgx tears down in the background (a cancel request and a
// drain, up to 15 s); the pool must not count it in use meanwhile, or the
// next calls of the outage read as a saturated pool (pool_exhausted, not
// timeout).
func TestPostgresTxBlackholeKeepsThePoolFree(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	pool := testdb.New(t, testdb.MaxConns(2), testdb.Configure(func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		cfg.ConnConfig.Fallbacks = nil
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second // longer than the calls: a black-holed connect outlives them
	}))
	// Before the schema is dropped: the black-holed connection's server
	// session holds the interrupted commit's transaction open until its
	// link closes.
	t.Cleanup(proxy.Restore)
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()
	const deadline = 300 * time.Millisecond
	inUse := func(what string) {
		t.Helper()
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%s returned with %d connections still counted in use", what, n)
		}
	}

	// One key committed first: the connection is open, its statements
	// prepared, the table resolved. The second's commit meets the black hole.
	for i := range 2 {
		req := idempotencytest.Request("u", time.Hour, time.Minute)
		tx, res, err := s.BeginClaim(ctx, &req)
		abortAtEnd(t, tx)
		if err != nil || !res.Won {
			t.Fatalf("BeginClaim %d: won %v, %v", i, res.Won, err)
		}
		settled := &idempotency.Settlement{Fence: res.Record.Fence(), Owner: res.Record,
			Response: idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}}
		if i == 0 {
			if err := tx.Commit(ctx, settled); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			continue
		}
		proxy.Blackhole()
		cctx, cancel := context.WithTimeout(ctx, deadline)
		err = tx.Commit(cctx, settled)
		cancel()
		if r := idempotencytest.StoreReason(t, "Commit", err); r != idempotency.ReasonTimeout {
			t.Errorf("Commit through a black hole: reason %q (%v), want timeout", r, err)
		}
		_ = tx.Abort(ctx) // as the middleware does after a failed commit
		inUse("the commit through a black hole")
	}

	for i := range 2 * pool.Config().MaxConns {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		req := idempotencytest.Request("u", time.Hour, time.Minute)
		start := time.Now()
		tx, _, err := s.BeginClaim(cctx, &req)
		elapsed := time.Since(start)
		cancel()
		abortAtEnd(t, tx)
		// Every connection of the pool is gone: the claim waits for the
		// pool to connect through the black hole, a wait on the pool
		// (DESIGN-settled-r4 item 4), never for one it counts in use.
		if r := idempotencytest.StoreReason(t, "BeginClaim", err); r != idempotency.ReasonPoolExhausted {
			t.Errorf("claim %d through a black hole: reason %q (%v), want pool_exhausted", i, r, err)
		}
		if elapsed > 5*deadline {
			t.Errorf("claim %d through a black hole took %v, want at most %v", i, elapsed, 5*deadline)
		}
		inUse("claim " + strconv.Itoa(int(i)) + " through a black hole")
	}
}
