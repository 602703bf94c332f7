package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

func TestPostgresErrors(t *testing.T) {
	t.Parallel()

	t.Run("MissingTableIsSchema", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		s := idempotency.NewPostgresStore(pool)
		rec := idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute)) // warm the statement cache
		if _, err := pool.Exec(t.Context(), `DROP TABLE idempotency_keys`); err != nil {
			t.Fatal(err)
		}
		_, err := s.Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonSchema {
			t.Errorf("Claim without the table: reason %q (%v), want schema", r, err)
		}
		err = s.Complete(t.Context(), rec.Fence(), rec, idempotency.Response{Status: 200, BodyKind: idempotency.BodyNone})
		if r := idempotencytest.StoreReason(t, "Complete", err); r != idempotency.ReasonSchema {
			t.Errorf("Complete without the table: reason %q (%v), want schema", r, err)
		}
		_, err = s.Cleanup(t.Context(), 10)
		if r := idempotencytest.StoreReason(t, "Cleanup", err); r != idempotency.ReasonSchema {
			t.Errorf("Cleanup without the table: reason %q (%v), want schema", r, err)
		}
	})

	t.Run("MissingTableIsTheTransactionalClaims", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		s := idempotency.NewPostgresStore(pool)
		if _, err := pool.Exec(t.Context(), `DROP TABLE idempotency_keys`); err != nil {
			t.Fatal(err)
		}
		req := idempotencytest.Request("u", time.Hour, time.Minute)
		tx, _, err := s.BeginClaim(t.Context(), &req)
		var se *idempotency.StoreError
		if tx != nil || !errors.As(err, &se) || se.Op != "claim" || se.Reason != idempotency.ReasonSchema {
			t.Fatalf("BeginClaim without the table: %v (%#v), want the claim's schema error", err, se)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still held", n)
		}
	})

	t.Run("RefusedValueIsData", func(t *testing.T) {
		t.Parallel()
		s := idempotency.NewPostgresStore(testdb.New(t))
		req := idempotencytest.Request("u", time.Hour, time.Minute)
		req.Scope = "tenant-\xff" // TEXT holds only valid UTF-8
		_, err := s.Claim(t.Context(), req)
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonData {
			t.Errorf("Claim of an invalid UTF-8 scope: reason %q (%v), want data", r, err)
		}
	})

	t.Run("MissingPrivilegeIsPermission", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		var b [6]byte
		_, _ = rand.Read(b[:])
		role := "idem_test_role_" + hex.EncodeToString(b[:])
		schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
		if _, err := pool.Exec(t.Context(), `CREATE ROLE `+role+` LOGIN; GRANT USAGE ON SCHEMA `+schema+` TO `+role); err != nil {
			if os.Getenv(testdb.EnvRequire) == "1" {
				t.Fatalf("cannot create a role (%s=1 forbids skipping): %v", testdb.EnvRequire, err)
			}
			t.Skipf("cannot create a role: %v", err)
		}
		t.Cleanup(func() {
			// Runs after the role's pool is closed (cleanups run last first).
			if _, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
				t.Errorf("drop role: %v", err)
			}
		})
		cfg := pool.Config()
		cfg.ConnConfig.User = role
		cfg.ConnConfig.Password = ""
		rolePool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rolePool.Close)
		_, err = idempotency.NewPostgresStore(rolePool).Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonPermission {
			t.Errorf("Claim without privileges: reason %q (%v), want permission", r, err)
		}
	})

	t.Run("ClosedPoolIsClosed", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		s := idempotency.NewPostgresStore(pool)
		pool.Close()
		_, err := s.Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonClosed {
			t.Errorf("Claim on a closed pool: reason %q (%v), want closed", r, err)
		}
		_, err = s.ExportScope(t.Context(), "u")
		if r := idempotencytest.StoreReason(t, "ExportScope", err); r != idempotency.ReasonClosed {
			t.Errorf("ExportScope on a closed pool: reason %q (%v), want closed", r, err)
		}
	})

	t.Run("PoolExhaustedIsPoolExhausted", func(t *testing.T) {
		// Every connection held by others and none being opened: the
		// database was never asked, so this is saturation, not an outage.
		t.Parallel()
		pool := testdb.New(t, testdb.MaxConns(1))
		conn, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err = idempotency.NewPostgresStore(pool).Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonPoolExhausted {
			t.Errorf("Claim with the pool exhausted: reason %q (%v), want pool_exhausted", r, err)
		}
	})

	t.Run("RefusedLoginIsAuth", func(t *testing.T) {
		// pgx reports a refused login as a *pgconn.ConnectError; its
		// SQLSTATE (class 28) decides: configuration, never an outage.
		t.Parallel()
		pool := testdb.New(t)
		for _, role := range []string{
			testRole(t, pool, "NOLOGIN"),     // 28000 role is not permitted to log in
			"idem_test_no_such_role_4f1c2b9", // 28000 role does not exist
		} {
			_, err := idempotency.NewPostgresStore(rolePool(t, pool, role)).Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
			if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonAuth {
				t.Errorf("Claim as a refused role: reason %q (%v), want auth", r, err)
			}
		}
	})

	t.Run("ConnectionLimitIsTooManyConnections", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		role := testRole(t, pool, "LOGIN CONNECTION LIMIT 0", grantAll...) // 53300 at login
		_, err := idempotency.NewPostgresStore(rolePool(t, pool, role)).Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonTooManyConnections {
			t.Errorf("Claim past the role's connection limit: reason %q (%v), want too_many_connections", r, err)
		}
	})

	t.Run("LockWaitIsLockTimeout", func(t *testing.T) {
		// A claim queued behind DDL under the production page's
		// lock_timeout: the database answered, so no outage.
		t.Parallel()
		pool := testdb.New(t, testdb.Configure(func(cfg *pgxpool.Config) {
			cfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
		}))
		s := idempotency.NewPostgresStore(pool)
		idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute)) // warm the statement cache
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(t.Context(), `LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		_, err = s.Claim(t.Context(), idempotencytest.Request("u", time.Hour, time.Minute))
		if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonLockTimeout {
			t.Errorf("Claim behind a table lock: reason %q (%v), want lock_timeout", r, err)
		}
	})

	// proxied returns a store whose pool goes through a proxy, with one
	// connection already open.
	proxied := func(t *testing.T) (*idempotency.PostgresStore, *pgxpool.Pool, *tcpproxy.Proxy) {
		t.Helper()
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
		s := idempotency.NewPostgresStore(pool)
		idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
		return s, pool, proxy
	}

	t.Run("BlackholeIsTimeout", func(t *testing.T) {
		t.Parallel()
		s, pool, proxy := proxied(t)
		proxy.Blackhole()
		const deadline = 300 * time.Millisecond
		for _, fresh := range []bool{false, true} {
			if fresh {
				pool.Reset() // the next call must connect through the black hole
			}
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			start := time.Now()
			_, err := s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
			elapsed := time.Since(start)
			cancel()
			// A statement sent on a live connection is a timeout; a call
			// that is still waiting for the pool to connect is a wait on
			// the pool (DESIGN-settled-r4 item 4): the probe, not the
			// claim, tells an outage.
			want := map[bool]string{false: idempotency.ReasonTimeout, true: idempotency.ReasonPoolExhausted}[fresh]
			if r := idempotencytest.StoreReason(t, "Claim", err); r != want {
				t.Errorf("Claim through a black hole (new connection %v): reason %q (%v), want %s", fresh, r, err, want)
			}
			if elapsed > 5*deadline {
				t.Errorf("Claim through a black hole (new connection %v) took %v, want at most %v", fresh, elapsed, 5*deadline)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("Claim through a black hole (new connection %v) returned holding %d connections", fresh, n)
			}
		}
		proxy.Restore()
		idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
	})

	t.Run("BlackholeKeepsThePoolFree", func(t *testing.T) {
		// A call interrupted by its deadline leaves a connection pgx closes
		// in the background (a cancel request and a drain, up to 15 s on a
		// black hole); the pool must not count it as in use meanwhile, or
		// the next calls of the outage read as a saturated pool.
		t.Parallel()
		s, pool, proxy := proxied(t)
		proxy.Blackhole()
		const deadline = 300 * time.Millisecond
		for i := range 2 * pool.Config().MaxConns {
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			start := time.Now()
			_, err := s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
			elapsed := time.Since(start)
			cancel()
			// The first call's statement was sent (timeout); the later ones
			// wait for the pool to connect through the black hole
			// (pool_exhausted, DESIGN-settled-r4 item 4), never for a
			// connection the pool still counts in use.
			want := map[bool]string{true: idempotency.ReasonTimeout, false: idempotency.ReasonPoolExhausted}[i == 0]
			if r := idempotencytest.StoreReason(t, "Claim", err); r != want {
				t.Errorf("call %d through a black hole: reason %q (%v), want %s", i, r, err, want)
			}
			if elapsed > 5*deadline {
				t.Errorf("call %d through a black hole took %v, want at most %v", i, elapsed, 5*deadline)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("call %d through a black hole returned with %d connections still counted in use", i, n)
			}
		}
	})

	t.Run("CutIsConnection", func(t *testing.T) {
		t.Parallel()
		s, _, proxy := proxied(t)
		proxy.Cut()
		for _, fresh := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			_, err := s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Minute))
			cancel()
			if r := idempotencytest.StoreReason(t, "Claim", err); r != idempotency.ReasonConnection {
				t.Errorf("Claim through a cut link (new connection %v): reason %q (%v), want connection", fresh, r, err)
			}
		}
		proxy.Restore()
		idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
	})

	t.Run("NoConnectTimeoutWarns", func(t *testing.T) {
		// A pool without a connect timeout is wedged for minutes by a
		// black-holed network: construction says so, once.
		t.Parallel()
		for _, timeout := range []time.Duration{0, 3 * time.Second} {
			pool := testdb.New(t, testdb.MaxConns(1), testdb.Configure(func(cfg *pgxpool.Config) {
				cfg.ConnConfig.ConnectTimeout = timeout
			}))
			log, buf := newLogBuffer()
			idempotency.NewPostgresStoreLoggingForTest(pool, log)
			lines := strings.Count(buf.String(), `"level":"WARN"`)
			if want := map[bool]int{true: 1}[timeout == 0]; lines != want || lines == 1 && !strings.Contains(buf.String(), "ConnectTimeout") {
				t.Errorf("ConnectTimeout %v: construction logged %q, want %d WARN naming ConnectTimeout", timeout, buf, want)
			}
		}
	})

	t.Run("NotOwnerIsNotAStoreError", func(t *testing.T) {
		t.Parallel()
		s := idempotency.NewPostgresStore(testdb.New(t))
		err := s.Fail(t.Context(), idempotency.Fence{ID: 12345, Attempt: 1})
		if err != idempotency.ErrNotOwner {
			t.Fatalf("Fail of an unknown row: %v, want ErrNotOwner itself", err)
		}
	})
}
