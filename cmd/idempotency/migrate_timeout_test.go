package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestMigrateDownHonoursTimeout: `migrate down --yes --timeout 1s` while a
// session holds a lock on idempotency_keys (an open transaction that read
// it, as an idle-in-transaction connection or a long transactional route
// does) gives up at the timeout, exit 1, with the table and the version as
// they were (not dirty). Found by a review: the DROP used to wait without
// bound, ignoring --timeout and Ctrl-C, while every claim queued behind it.
func TestMigrateDownHonoursTimeout(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	ctx := t.Context()

	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}

	const timeout = time.Second
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type res struct {
		code           int
		stdout, stderr string
	}
	done := make(chan res, 1)
	start := time.Now()
	go func() {
		var out, errOut bytes.Buffer
		code := run(cctx, []string{"--database-url", db.dsn, "migrate", "down", "--yes", "--timeout", timeout.String()},
			&out, &errOut, func(string) string { return "" })
		done <- res{code, out.String(), errOut.String()}
	}()

	bound := 10 * timeout
	var r res
	select {
	case r = <-done:
	case <-time.After(bound):
		// Ctrl-C does not help either.
		cancel()
		select {
		case r = <-done:
			t.Errorf("migrate down --timeout %v only returned after a cancel (SIGINT), %v after start", timeout, time.Since(start))
		case <-time.After(5 * time.Second):
			// Release the lock so the goroutine (and the DROP) can finish.
			_ = tx.Rollback(context.Background())
			r = <-done
			t.Errorf("migrate down --timeout %v hung for over %v and ignored a cancel (SIGINT); it finished only when the lock holder went away: exit %d, stdout %q, stderr %q",
				timeout, bound, r.code, r.stdout, r.stderr)
			var exists bool
			if err := db.pool.QueryRow(context.Background(), `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if !exists && r.code != exitOK {
				t.Errorf("and it exited %d although the table WAS dropped", r.code)
			}
		}
		return
	}
	if r.code != exitFailure || !strings.Contains(r.stderr, "timed out") {
		t.Errorf("exit %d, stderr %q; want 1 and a timeout message", r.code, r.stderr)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	v := runDB(t, db.dsn, "migrate", "version", "--json")
	wantCode(t, v, exitOK)
	if !strings.Contains(v.stdout, `"version": 2`) || !strings.Contains(v.stdout, `"dirty": false`) {
		t.Errorf("after the timed-out down: %s; want version 2 (000002_round4, the first step down timed out), not dirty", v.stdout)
	}
}
