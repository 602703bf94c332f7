package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// Environment of TestGroupCommitKillChild, the process
// TestGroupCommitKill kills.
const (
	envKillDSN    = "IDEMPOTENCY_TEST_GC_KILL_DSN"
	envKillPrefix = "IDEMPOTENCY_TEST_GC_KILL_PREFIX"
)

// killKeys is how many keys the child runs at once, and killAfter how
// many of them have been recorded (Do returned) when it says so.
const killKeys, killAfter = 64, 8

// killConfig is the child's and the retries' configuration: a short lease,
// so that a key the killed process held is stale soon.
var killConfig = idempotency.Config{StoreTimeout: time.Second, Lease: 3 * time.Second}

// TestGroupCommitKill: a process running 64 calls of Do at once through
// one batch slot (their claims and records batched; the odd keys' functions
// block after their effect) is killed with SIGKILL once 8 calls have been
// recorded, the other calls' claims and records in flight.
// A fresh process retries every key until it has a final answer: each key
// makes its effect at most once, and its final answer is a replay, its
// first execution (its claim never committed), or outcome_unknown (its
// claim committed before the kill and its record did not; settled-r4 item
// 26).
func TestGroupCommitKill(t *testing.T) {
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
	prefix := uuid.NewString()
	killWhenBooked(t, "TestGroupCommitKillChild", envKillDSN+"="+dsn, envKillPrefix+"="+prefix)

	op := newOp(t, idempotency.NewPostgresStore(pool), killConfig, idempotency.RouteConfig{})
	var replayed, executed, unknown int
	for i := range killKeys {
		key := fmt.Sprintf("%s-%02d", prefix, i)
		for deadline := time.Now().Add(time.Minute); ; {
			_, info, err := idempotency.Do(t.Context(), op, payment(key), func(ctx context.Context) (receipt, error) {
				_, err := pool.Exec(ctx, `INSERT INTO ledger (payment) VALUES ($1)`, key)
				return receipt{}, err
			})
			switch {
			case err == nil && info.Replayed:
				replayed++
			case err == nil:
				executed++
			case errors.Is(err, idempotency.ErrOutcomeUnknown):
				unknown++
			case errors.Is(err, idempotency.ErrInFlight) && time.Now().Before(deadline):
				time.Sleep(100 * time.Millisecond) // a client's pause before it retries
				continue
			default:
				t.Fatalf("key %d: %+v %v", i, info, err)
			}
			break
		}
		if n := ledgerRows(t, pool, key); n > 1 {
			t.Fatalf("key %d made its effect %d times", i, n)
		}
	}
	t.Logf("after the kill: %d replayed, %d executed by the retry, %d outcome unknown", replayed, executed, unknown)
	if replayed < killAfter {
		t.Errorf("%d keys replayed, want at least the %d the child had recorded", replayed, killAfter)
	}
}

// TestGroupCommitKillChild is the process TestGroupCommitKill kills.
func TestGroupCommitKillChild(t *testing.T) {
	dsn := os.Getenv(envKillDSN)
	if dsn == "" {
		t.Skip("run by TestGroupCommitKill")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	store := idempotency.NewPostgresStore(pool)
	store.SetBatching(32, 1)
	op := newOp(t, store, killConfig, idempotency.RouteConfig{})
	var recorded atomic.Int64
	prefix := os.Getenv(envKillPrefix)
	for i := range killKeys {
		key := fmt.Sprintf("%s-%02d", prefix, i)
		go func() {
			_, _, err := idempotency.Do(context.Background(), op, payment(key), func(ctx context.Context) (receipt, error) {
				if _, err := pool.Exec(ctx, `INSERT INTO ledger (payment) VALUES ($1)`, key); err != nil {
					return receipt{}, err
				}
				if i%2 == 1 {
					select {} // killed here, mid-function
				}
				return receipt{Ledger: int64(i)}, nil
			})
			if err == nil && recorded.Add(1) == killAfter {
				fmt.Println("booked")
			}
		}()
	}
	select {} // killed
}
