package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// probeWait bounds how long the probe's INSERT waits on another session's
// row of the key.
const probeWait = time.Second

// probeInsertSQL tries to claim the key in the probe's own transaction,
// which is always rolled back: it waits on an uncommitted row of the key
// (an owner mid-handler on a transactional route) until probeWait.
const probeInsertSQL = `INSERT INTO ` + table + `
	(idem_key, scope_user_id, scope_endpoint, request_hash, locked_until, expires_at)
VALUES ($1, $2, $3, '', now(), now())
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING`

// probeBlockerSQL reads the session the probe's backend ($1) waits for.
const probeBlockerSQL = `SELECT pid, coalesce(application_name, ''), coalesce(client_addr::text, 'local'),
	coalesce(xact_start, now()), coalesce(state, ''), now()
FROM pg_stat_activity
WHERE pid = ANY(pg_blocking_pids($1))
ORDER BY xact_start
LIMIT 1`

// openOwner is the session that holds a key in flight inside its open
// transaction, as pg_stat_activity shows it.
type openOwner struct {
	PID             int       `json:"pid"`
	ApplicationName string    `json:"application_name"`
	ClientAddr      string    `json:"client_addr"`
	XactStart       time.Time `json:"transaction_start"`
	State           string    `json:"state"`
	now             time.Time
}

// probeOpenTransaction finds a key held in flight inside another session's
// open transaction, which no query can see: it inserts the key in a
// transaction of its own that it always rolls back, waiting up to
// probeWait, while a second session asks pg_blocking_pids() which backend
// the insert waits for. It returns nil when nothing held the key.
func probeOpenTransaction(ctx context.Context, pool *pgxpool.Pool, key, user, endpoint string) (*openOwner, error) {
	ctx, cancel := context.WithTimeout(ctx, probeWait+5*time.Second)
	defer cancel()
	prober, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer prober.Release()
	watcher, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer watcher.Release()
	var pid int
	if err := prober.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil, err
	}
	tx, err := prober.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // the probe never keeps the key
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", probeWait.Milliseconds())); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, probeInsertSQL, key, user, endpoint)
		done <- err
	}()
	var owner *openOwner
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			// The insert went through (no owner), or its lock wait ran
			// out (an owner, read below while it waited).
			return owner, nil
		case <-tick.C:
		}
		if owner != nil {
			continue
		}
		var o openOwner
		err := watcher.QueryRow(ctx, probeBlockerSQL, pid).Scan(&o.PID, &o.ApplicationName, &o.ClientAddr, &o.XactStart, &o.State, &o.now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, err
		default:
			owner = &o
		}
	}
}

// printOpenOwner shows the session that holds the key in flight.
func (c *cli) printOpenOwner(o *openOwner) {
	fmt.Fprintf(c.stdout, "in flight inside an open transaction (a transactional route's handler is running): held by backend pid %d\n", o.PID)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "app", o.ApplicationName)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "client", o.ClientAddr)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "since", when(o.XactStart, o.now))
	fmt.Fprintf(c.stdout, "%-10s %s\n", "state", o.State)
}
