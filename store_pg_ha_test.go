package idempotency_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
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

// replyCutter loses the server's whole reply to chosen statements: a
// connection that sent a statement holding marker reads that statement's
// reply up to its ReadyForQuery (so the server has run and committed it),
// drops it and fails as a lost connection would. It cuts the first cuts
// such statements, over every connection of the pool.
type replyCutter struct {
	marker []byte
	cuts   atomic.Int32 // replies still to cut
	cut    atomic.Int32 // replies cut so far
}

// option configures a test pool to dial through rc, in the exec query mode
// (each statement is one write holding its SQL text and one reply).
func (rc *replyCutter) option() testdb.Option {
	return testdb.Configure(func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &cutConn{Conn: conn, rc: rc}, nil
		}
	})
}

// cutConn is one connection dialled through a replyCutter.
type cutConn struct {
	net.Conn
	rc    *replyCutter
	armed atomic.Bool // a statement to cut was sent: its reply is lost
}

func (c *cutConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.rc.marker) && c.rc.cuts.Add(-1) >= 0 {
		c.armed.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	if !c.armed.CompareAndSwap(true, false) {
		return c.Conn.Read(b)
	}
	var reply []byte
	chunk := make([]byte, 4096)
	for !readyForQuery(reply) {
		n, err := c.Conn.Read(chunk)
		reply = append(reply, chunk[:n]...)
		if err != nil {
			break
		}
	}
	c.rc.cut.Add(1)
	c.Conn.Close()
	return 0, io.ErrUnexpectedEOF
}

// readyForQuery reports whether the backend messages in b include a
// ReadyForQuery ('Z'): the server has finished the statement and its
// implicit transaction.
func readyForQuery(b []byte) bool {
	for len(b) >= 5 {
		n := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < n {
			return false
		}
		if b[0] == 'Z' {
			return true
		}
		b = b[n:]
	}
	return false
}

// TestPostgresClaimRetryWinsItsOwnRow: a claim whose reply is lost after
// the server committed it is run again by the store on a new connection;
// with an owner token the retry recognises the row as its own claim and
// wins it (the request goes on and records its outcome), where without
// one it reads the row as someone else's claim in flight (the behaviour
// before owner tokens: the request answered 409 and the key stayed in
// flight until its lease or TTL ended).
func TestPostgresClaimRetryWinsItsOwnRow(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("INSERT INTO idempotency_keys")}
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	owned := idempotencytest.Request("u", time.Hour, time.Minute)
	owned.Owner = uuid.New()
	rc.cuts.Store(1)
	res, err := s.Claim(ctx, owned)
	if err != nil || !res.Won {
		t.Fatalf("Claim whose first reply was lost: won %v, %v; want won", res.Won, err)
	}
	if n := rc.cut.Load(); n != 1 {
		t.Fatalf("%d replies cut, want 1", n)
	}
	if res.Record.Attempt != 1 || res.Record.Status != idempotency.StatusInFlight || res.Record.LeaseOver {
		t.Errorf("won record: attempt %d status %q lease over %v, want 1, in_flight, false", res.Record.Attempt, res.Record.Status, res.Record.LeaseOver)
	}
	if err := s.Complete(ctx, res.Record.Fence(), idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete by the retried claim: %v", err)
	}

	anonymous := idempotencytest.Request("u", time.Hour, time.Minute)
	rc.cuts.Store(1)
	res, err = s.Claim(ctx, anonymous)
	if err != nil || res.Won || res.Record.Status != idempotency.StatusInFlight {
		t.Fatalf("Claim without a token whose first reply was lost: won %v status %q, %v; want its own row read as in flight by another",
			res.Won, res.Record.Status, err)
	}
	if n := rc.cut.Load(); n != 2 {
		t.Fatalf("%d replies cut, want 2", n)
	}
}

// TestPostgresReleaseOwnerFreesAnUnknownClaim: a claim that failed with
// both replies lost (its outcome unknown to the caller, although it
// committed) leaves the key in flight; ReleaseOwner with the claim's token,
// what the middleware calls when the handler never ran, frees it, and the
// next request claims the key as new.
func TestPostgresReleaseOwnerFreesAnUnknownClaim(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("INSERT INTO idempotency_keys")}
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	req := idempotencytest.Request("u", time.Hour, time.Minute)
	req.Owner = uuid.New()
	rc.cuts.Store(2)
	_, err := s.Claim(ctx, req)
	if got := idempotencytest.StoreReason(t, "claim with both replies lost", err); got != idempotency.ReasonConnection {
		t.Fatalf("reason %q, want %q: %v", got, idempotency.ReasonConnection, err)
	}
	next := req
	next.Owner = uuid.New()
	if res, err := s.Claim(ctx, next); err != nil || res.Won || res.Record.Status != idempotency.StatusInFlight {
		t.Fatalf("the key after the unknown claim: won %v status %q, %v; want in flight", res.Won, res.Record.Status, err)
	}
	released, err := s.ReleaseOwner(ctx, req)
	if err != nil || !released {
		t.Fatalf("ReleaseOwner: %v, %v; want true", released, err)
	}
	res, err := s.Claim(ctx, next)
	if err != nil || !res.Won || res.Record.Attempt != 1 {
		t.Fatalf("Claim after ReleaseOwner: won %v attempt %d, %v; want a new claim", res.Won, res.Record.Attempt, err)
	}
}

// TestPostgresTakeoverLostReplyThenOwnClaimWins: a takeover whose reply is
// lost after it committed reads as lost on the store's retry (its fence
// no longer matches); the request's next Claim with the same owner token,
// which the middleware makes after a lost takeover, wins the row the
// takeover made, so the request still runs once, as the owner.
func TestPostgresTakeoverLostReplyThenOwnClaimWins(t *testing.T) {
	t.Parallel()
	rc := &replyCutter{marker: []byte("UPDATE idempotency_keys SET\n\tattempt = attempt + 1,\n\trequest_hash")}
	pool := testdb.New(t, testdb.MaxConns(2), rc.option())
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()

	first := idempotencytest.Request("u", time.Millisecond, time.Millisecond)
	rec := idempotencytest.MustClaim(t, s, first)
	if err := s.Complete(ctx, rec.Fence(), idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatal(err)
	}
	expired := idempotencytest.WaitFor(t, s, first, "in the awaited state", func(r idempotency.Record) bool { return r.Expired })

	second := first
	second.TTL, second.Lease, second.Owner = time.Hour, time.Minute, uuid.New()
	rc.cuts.Store(1)
	res, err := s.Takeover(ctx, expired.Fence(), second)
	if err != nil || res.Won {
		t.Fatalf("Takeover whose reply was lost: won %v, %v; want a loss (its retry's fence no longer matches)", res.Won, err)
	}
	if n := rc.cut.Load(); n != 1 {
		t.Fatalf("%d replies cut, want 1", n)
	}
	res, err = s.Claim(ctx, second)
	if err != nil || !res.Won || res.Record.Attempt != expired.Attempt+1 {
		t.Fatalf("Claim with the takeover's token: won %v attempt %d, %v; want won, attempt %d", res.Won, res.Record.Attempt, err, expired.Attempt+1)
	}
	if err := s.Complete(ctx, res.Record.Fence(), idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete by the takeover's owner: %v", err)
	}
}
