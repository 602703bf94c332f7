package idempotency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestDoPostgresOutage cuts the connection to PostgreSQL for real: a
// fail-closed Operation returns ErrStoreUnavailable without running its
// function; a fail-open one runs it and says it bypassed.
func TestDoPostgresOutage(t *testing.T) {
	t.Parallel()
	base := testdb.New(t)
	proxy := tcpproxy.New(t, fmt.Sprintf("%s:%d", base.Config().ConnConfig.Host, base.Config().ConnConfig.Port))
	cfg := base.Config().Copy()
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const storeTimeout = 500 * time.Millisecond
	mwCfg := idempotency.Config{StoreTimeout: storeTimeout, Lease: 2 * time.Second}
	closed := newOp(t, idempotency.NewPostgresStore(pool), mwCfg, idempotency.RouteConfig{})
	open := newOp(t, idempotency.NewPostgresStore(pool), mwCfg, idempotency.RouteConfig{FailOpen: true})
	ran := 0
	fn := func(context.Context) (receipt, error) { ran++; return receipt{Ledger: int64(ran)}, nil }
	if _, _, err := idempotency.Do(t.Context(), closed, payment(uuid.NewString()), fn); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	proxy.Cut()
	start := time.Now()
	_, _, err = idempotency.Do(t.Context(), closed, payment(uuid.NewString()), fn)
	if el := time.Since(start); el > 5*storeTimeout {
		t.Fatalf("fail-closed answered after %v, bound %v", el, 5*storeTimeout)
	}
	wantAnswer(t, "fail-closed during the outage", err, idempotency.ErrStoreUnavailable, 503)
	var se *idempotency.StoreError
	if !errors.As(err, &se) || ran != 1 {
		t.Fatalf("fail-closed: %v carries no *StoreError, or the function ran (%d runs)", err, ran)
	}
	v, info, err := idempotency.Do(t.Context(), open, payment(uuid.NewString()), fn)
	if err != nil || !info.Bypassed || info.Replayed || v.Ledger != 2 {
		t.Fatalf("fail-open during the outage: %+v %+v %v; want a bypass that runs the function", v, info, err)
	}
	proxy.Restore()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, info, err = idempotency.Do(t.Context(), closed, payment(uuid.NewString()), fn)
		if err == nil && !info.Bypassed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the outage: %+v %v", info, err)
		}
		time.Sleep(50 * time.Millisecond) // the pool reconnects on its own time
	}
}

// ledgerOp is a transactional Operation over a fresh schema with a ledger
// table its function writes through the lent transaction.
func ledgerOp(t *testing.T, cfg idempotency.Config, rc idempotency.RouteConfig) (*idempotency.Operation, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), ledgerDDL); err != nil {
		t.Fatal(err)
	}
	rc.Transactional = true
	return newOp(t, idempotency.NewPostgresStore(pool), cfg, rc), pool
}

const ledgerDDL = `CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, payment TEXT NOT NULL)`

// book writes one ledger row for the call's key through the transaction in
// ctx and returns its id.
func book(ctx context.Context) (int64, error) {
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return 0, errors.New("no transaction in the function's context")
	}
	key, _ := idempotency.KeyFromContext(ctx)
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (payment) VALUES ($1) RETURNING id`, key).Scan(&id)
	return id, err
}

// ledgerRows counts the committed ledger rows of payment key.
func ledgerRows(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE payment = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDoTransactional: the function's writes and the key's record commit
// together; a permanent error commits them too; any other error, and a
// retryable one, roll them back.
func TestDoTransactional(t *testing.T) {
	t.Parallel()
	op, pool := ledgerOp(t, idempotency.Config{}, idempotency.RouteConfig{})
	t.Run("Value", func(t *testing.T) {
		key := uuid.NewString()
		fn := func(ctx context.Context) (receipt, error) {
			id, err := book(ctx)
			return receipt{Ledger: id}, err
		}
		first, _, err := idempotency.Do(t.Context(), op, payment(key), fn)
		if err != nil || ledgerRows(t, pool, key) != 1 {
			t.Fatalf("first: %+v %v, %d rows", first, err, ledgerRows(t, pool, key))
		}
		again, info, err := idempotency.Do(t.Context(), op, payment(key), fn)
		if err != nil || !info.Replayed || again != first || ledgerRows(t, pool, key) != 1 {
			t.Fatalf("replay: %+v %+v %v, %d rows", again, info, err, ledgerRows(t, pool, key))
		}
	})
	t.Run("PermanentErrorCommits", func(t *testing.T) {
		key := uuid.NewString()
		fn := func(ctx context.Context) (receipt, error) {
			if _, err := book(ctx); err != nil { // the rejection's own ledger entry
				return receipt{}, err
			}
			return receipt{}, &idempotency.PermanentError{Code: "insufficient_funds", Message: "declined"}
		}
		for range 2 {
			_, _, err := idempotency.Do(t.Context(), op, payment(key), fn)
			var pe *idempotency.PermanentError
			if !errors.As(err, &pe) || pe.Code != "insufficient_funds" {
				t.Fatalf("permanent: %v", err)
			}
		}
		if n := ledgerRows(t, pool, key); n != 1 {
			t.Fatalf("%d rows; a permanent error commits the function's writes once", n)
		}
	})
	t.Run("ErrorRollsBack", func(t *testing.T) {
		key := uuid.NewString()
		boom := errors.New("downstream refused")
		_, _, err := idempotency.Do(t.Context(), op, payment(key), func(ctx context.Context) (receipt, error) {
			if _, err := book(ctx); err != nil {
				return receipt{}, err
			}
			return receipt{}, boom
		})
		if !errors.Is(err, boom) || ledgerRows(t, pool, key) != 0 {
			t.Fatalf("error: %v, %d rows; want the error and the write rolled back", err, ledgerRows(t, pool, key))
		}
		_, _, err = idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) { return receipt{}, nil })
		wantAnswer(t, "after the error", err, idempotency.ErrPreviousFailed, 409)
	})
	t.Run("RetryableRollsBackAndReleases", func(t *testing.T) {
		key := uuid.NewString()
		_, _, err := idempotency.Do(t.Context(), op, payment(key), func(ctx context.Context) (receipt, error) {
			if _, err := book(ctx); err != nil {
				return receipt{}, err
			}
			return receipt{}, idempotency.Retryable(errors.New("try later"))
		})
		if err == nil || ledgerRows(t, pool, key) != 0 {
			t.Fatalf("retryable: %v, %d rows", err, ledgerRows(t, pool, key))
		}
		if _, _, err := idempotency.Do(t.Context(), op, payment(key), func(ctx context.Context) (receipt, error) {
			id, err := book(ctx)
			return receipt{Ledger: id}, err
		}); err != nil || ledgerRows(t, pool, key) != 1 {
			t.Fatalf("the retry: %v, %d rows", err, ledgerRows(t, pool, key))
		}
	})
	t.Run("KillSwitchKeepsTheTransaction", func(t *testing.T) {
		off := newOp(t, idempotency.NewPostgresStore(pool), idempotency.Config{Enabled: func(context.Context) bool { return false }},
			idempotency.RouteConfig{Transactional: true, FollowKillSwitch: true})
		// A pass-through has no key: its row is booked under "".
		_, info, err := idempotency.Do(t.Context(), off, payment(uuid.NewString()), func(ctx context.Context) (receipt, error) {
			_, err := book(ctx)
			return receipt{}, err
		})
		if err != nil || !info.Bypassed || ledgerRows(t, pool, "") != 1 {
			t.Fatalf("kill-switch off: %+v %v, %d rows; want the function run in a transaction that commits", info, err, ledgerRows(t, pool, ""))
		}
	})
}

// Environment of TestDoCrashChild, the process TestDoCrash kills.
const (
	envCrashDSN = "IDEMPOTENCY_TEST_DO_CRASH_DSN"
	envCrashKey = "IDEMPOTENCY_TEST_DO_CRASH_KEY"
)

// TestDoCrash: a process killed with SIGKILL in the middle of a
// transactional function leaves nothing behind: the retry runs at once
// (no lease to wait out, no outcome unknown) and the payment's ledger row
// exists exactly once.
func TestDoCrash(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewDSN(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(t.Context(), ledgerDDL); err != nil {
		t.Fatal(err)
	}
	key := "msg-" + uuid.NewString()
	killWhenBooked(t, "TestDoCrashChild", envCrashDSN+"="+dsn, envCrashKey+"="+key)

	// The retry waits on the dead session's row only until the server has
	// rolled it back (TxLockWait), never for the lease. Its five tries
	// may each wait the bound out inside the store timeout.
	op := newOp(t, idempotency.NewPostgresStore(pool), idempotency.Config{StoreTimeout: 30 * time.Second, Lease: time.Minute},
		idempotency.RouteConfig{Transactional: true, TxLockWait: 5 * time.Second})
	start := time.Now()
	v, info, err := idempotency.Do(t.Context(), op, payment(key), func(ctx context.Context) (receipt, error) {
		id, err := book(ctx)
		return receipt{Ledger: id}, err
	})
	if err != nil || info.Replayed || v.Ledger == 0 {
		t.Fatalf("the retry after the crash: %+v %+v %v; want it to run", v, info, err)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("the retry took %v", el)
	}
	if n := ledgerRows(t, pool, key); n != 1 {
		t.Fatalf("%d ledger rows for the payment, want exactly 1", n)
	}
	if _, info, err := idempotency.Do(t.Context(), op, payment(key), func(context.Context) (receipt, error) {
		return receipt{}, errors.New("ran a third time")
	}); err != nil || !info.Replayed {
		t.Fatalf("after the retry: %+v %v; want the replay", info, err)
	}
}

// TestDoCrashChild is the process TestDoCrash kills: it books the payment
// inside Do's transaction, says so, and waits to be killed.
func TestDoCrashChild(t *testing.T) {
	dsn := os.Getenv(envCrashDSN)
	if dsn == "" {
		t.Skip("run by TestDoCrash")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	op := newOp(t, idempotency.NewPostgresStore(pool), idempotency.Config{StoreTimeout: 10 * time.Second, Lease: time.Minute},
		idempotency.RouteConfig{Transactional: true})
	_, _, err = idempotency.Do(context.Background(), op, payment(os.Getenv(envCrashKey)), func(ctx context.Context) (receipt, error) {
		if _, err := book(ctx); err != nil {
			return receipt{}, err
		}
		fmt.Println("booked")
		select {} // killed here, mid-function
	})
	t.Fatalf("Do returned: %v", err)
}

// killWhenBooked runs the test binary's test named child in a process of
// its own, with env added, waits for it to print the line "booked" and
// kills it with SIGKILL.
func killWhenBooked(t *testing.T, child string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // our own child, by its pid
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "booked" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the child ended before it booked")
		}
	case <-time.After(time.Minute):
		t.Fatal("the child never booked")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}
