package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// neverPing stops pgxpool from pinging a connection idle for over a second
// before handing it out: under load no connection idles that long, so a
// connection the server ended is handed out as it is, as here.
var neverPing = testdb.Configure(func(c *pgxpool.Config) {
	c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
})

// terminateIdle ends, from the server side (what an administrator, a
// restart or a failover does), every connection pool holds, all idle, and
// waits until each backend has gone.
func terminateIdle(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conns := pool.AcquireAllIdle(t.Context())
	if len(conns) == 0 {
		t.Fatal("the pool holds no idle connection")
	}
	admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	for _, c := range conns {
		pid := c.Conn().PgConn().PID()
		c.Release()
		var ended bool
		if err := admin.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&ended); err != nil || !ended {
			t.Fatalf("terminate backend %d: %v %v", pid, ended, err)
		}
	}
}

// TestPostgresRetriesAfterConnectionLoss: a claim, a takeover and an
// export whose pooled connection the server has ended succeed on a new
// connection, instead of failing the request.
func TestPostgresRetriesAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(1), neverPing)
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	first := idempotencytest.Request("u", time.Millisecond, time.Minute)
	if err := pool.Ping(ctx); err != nil { // opens the connection
		t.Fatal(err)
	}
	terminateIdle(t, pool)
	rec := idempotencytest.MustClaim(t, s, first) // fails without the retry
	if err := s.Complete(ctx, rec.Fence(), idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	expired := idempotencytest.WaitFor(t, s, first, "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

	terminateIdle(t, pool)
	res, err := s.Takeover(ctx, expired.Fence(), first)
	if err != nil || !res.Won {
		t.Fatalf("Takeover after the connection was ended: %+v, %v", res, err)
	}

	terminateIdle(t, pool)
	recs, err := s.ExportScope(ctx, "u")
	if err != nil || len(recs) != 1 {
		t.Fatalf("ExportScope after the connection was ended: %d records, %v", len(recs), err)
	}
}

// TestPostgresRetriesConnectionLossOnce: when the retry's connection is
// dead too, the claim fails with reason connection (no loop), and the
// next claim, on a fresh connection, succeeds.
func TestPostgresRetriesConnectionLossOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t, testdb.MaxConns(2), neverPing)
	s := idempotency.NewPostgresStore(pool)
	// Open both connections, then end them.
	a, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	b.Release()
	terminateIdle(t, pool)

	_, err = s.Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
	if got := idempotencytest.StoreReason(t, "claim on two dead connections", err); got != idempotency.ReasonConnection {
		t.Fatalf("reason %q, want %q: %v", got, idempotency.ReasonConnection, err)
	}
	idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
}
