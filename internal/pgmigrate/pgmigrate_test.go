package pgmigrate_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/pgmigrate"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestMain checks for leaked goroutines, except golang-migrate's own: when
// a run fails before a migration's body is read (its history TRUNCATE gave
// up), golang-migrate leaves the goroutine that buffers that body blocked
// on a pipe nobody reads, for the life of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m),
		goleak.IgnoreAnyFunction("github.com/golang-migrate/migrate/v4.(*Migrate).readUp.func1"))
}

// files is one migration, enough to have something to wait for.
var files = fstest.MapFS{
	"000001_things.up.sql":   {Data: []byte(`CREATE TABLE things (id int);`)},
	"000001_things.down.sql": {Data: []byte(`DROP TABLE things;`)},
}

// bound is how long a call given a short deadline may take before the test
// calls it hung: generous, it only turns a hang into a failure.
const bound = 10 * time.Second

func newMigrator(t *testing.T, pool *pgxpool.Pool) *pgmigrate.Migrator {
	t.Helper()
	m, err := pgmigrate.New(t.Context(), pool, files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// state returns the applied version (-1 for none) and the dirty flag.
func state(t *testing.T, m *pgmigrate.Migrator) (int, bool) {
	t.Helper()
	v, dirty := -1, false
	err := m.Run(t.Context(), func(mg *migrate.Migrate) error {
		u, d, err := mg.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		v, dirty = int(u), d
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v, dirty
}

// holdLock opens a transaction that reads table, so it holds ACCESS SHARE
// on it (as pg_dump or an idle-in-transaction session would) until the
// test rolls it back.
func holdLock(t *testing.T, pool *pgxpool.Pool, table string) (pgx.Tx, uint32) {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `SELECT count(*) FROM `+table); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := tx.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// within runs f and returns its error and how long it took; past bound it
// fails the test and ends the lock holder tx so f can return.
func within(t *testing.T, tx pgx.Tx, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(bound):
		_ = tx.Rollback(context.Background())
		err := <-done
		t.Fatalf("still waiting after %v, for the lock holder: it returned %v only once the lock was gone", bound, err)
		return 0, err
	}
}

// down runs m.Down under ctx, timing it.
func down(ctx context.Context, m *pgmigrate.Migrator) (time.Duration, error) {
	start := time.Now()
	err := m.Run(ctx, func(mg *migrate.Migrate) error { return mg.Down() })
	return time.Since(start), err
}

// TestUpBoundedWhileHistoryLocked: a session reading the history table
// blocks golang-migrate's TRUNCATE of it; Up gives up at its deadline
// instead of waiting for that session, leaves nothing applied and nothing
// dirty, and succeeds once the session is gone.
func TestUpBoundedWhileHistoryLocked(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	m := newMigrator(t, pool) // creates the history table
	tx, _ := holdLock(t, pool, pgmigrate.HistoryTable)

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if took, err := within(t, tx, func() error { return m.Up(ctx) }); err == nil || took > bound {
		t.Fatalf("Up with the history table locked: %v after %v; want an error at the deadline", err, took)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v, dirty := state(t, m); v != -1 || dirty {
		t.Fatalf("after the failed Up: version %d dirty %v; want none, clean", v, dirty)
	}
	if err := m.Up(t.Context()); err != nil {
		t.Fatalf("Up once the lock is gone: %v", err)
	}
	if v, dirty := state(t, m); v != 1 || dirty {
		t.Fatalf("after Up: version %d dirty %v", v, dirty)
	}
}

// TestDownBoundedAndRepaired: a DROP that waits behind live traffic gives
// up at the deadline (instead of queueing every later user of the table
// behind it indefinitely), and the version stays where it was, not dirty:
// the migration rolled back whole.
func TestDownBoundedAndRepaired(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	m := newMigrator(t, pool)
	if err := m.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	tx, _ := holdLock(t, pool, "things")

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if took, err := within(t, tx, func() error { _, err := down(ctx, m); return err }); err == nil || took > bound {
		t.Fatalf("Down behind a lock: %v after %v; want an error at the deadline", err, took)
	}
	if v, dirty := state(t, m); v != 1 || dirty {
		t.Fatalf("after the failed Down: version %d dirty %v; want 1, clean", v, dirty)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := down(t.Context(), m); err != nil {
		t.Fatalf("Down once the lock is gone: %v", err)
	}
	if v, dirty := state(t, m); v != -1 || dirty {
		t.Fatalf("after Down: version %d dirty %v; want none", v, dirty)
	}
}

// TestCancelStopsAWaitingMigration: a context cancelled without a deadline
// (an operator's Ctrl-C) cancels the migration waiting for its lock; it
// rolls back and the version stays clean.
func TestCancelStopsAWaitingMigration(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmpty(t)
	m := newMigrator(t, pool)
	if err := m.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, blocker := holdLock(t, pool, "things")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := down(ctx, m); done <- err }()
	// Wait until the DROP waits for the blocker's lock.
	for start := time.Now(); ; {
		var n int
		if err := pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, int32(blocker)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Since(start) > bound {
			t.Fatal("the DROP never waited for the lock")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not synchronisation
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Down after cancel: %v; want context.Canceled", err)
		}
	case <-time.After(bound):
		t.Fatal("Down ignored the cancel")
	}
	if v, dirty := state(t, m); v != 1 || dirty {
		t.Fatalf("after the cancelled Down: version %d dirty %v; want 1, clean", v, dirty)
	}
}
