package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// probeWait bounds how long the probe's INSERT waits on another session's
// row of the key; probeWaitCitus on Citus, whose lock views take about a
// second to name the owner.
const (
	probeWait      = time.Second
	probeWaitCitus = 3 * time.Second
)

// probeSetupSQL reads, on the probe's connection, its backend pid, whether
// the Citus lock views exist (a Citus coordinator, where pg_blocking_pids()
// sees no wait on a worker), and the table ($1) schema-qualified, as the
// search_path resolves it (NULL: none).
const probeSetupSQL = `SELECT pg_backend_pid(),
	to_regclass('citus_lock_waits') IS NOT NULL AND to_regclass('citus_stat_activity') IS NOT NULL
		AND to_regprocedure('citus_backend_gpid()') IS NOT NULL,
	(SELECT format('%s.%I', relnamespace::regnamespace, relname) FROM pg_class WHERE oid = to_regclass($1))`

// probeGPIDSQL reads the probe's global pid on Citus, by which
// citus_lock_waits names its wait.
const probeGPIDSQL = `SELECT citus_backend_gpid()`

// probeWaitSQL and probeCitusWaitSQL bound the probe's wait (probeWait,
// probeWaitCitus) with SET LOCAL, which Citus passes to the workers when
// citus.propagate_set_commands is 'local' (probeCitusSetSQL, for the
// probe's transaction); set_config never reaches them.
const (
	probeWaitSQL      = `SET LOCAL lock_timeout = '1000ms'`
	probeCitusWaitSQL = `SET LOCAL lock_timeout = '3000ms'`
	probeCitusSetSQL  = `SET LOCAL citus.propagate_set_commands = 'local'`
)

// probeInsertSQL tries to claim the key in the probe's own transaction,
// which is always rolled back: it waits on an uncommitted row of the key
// (an owner mid-handler on a transactional route) until its bound. It is
// sent with the table schema-qualified as probeSetupSQL resolved it.
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

// probeCitusBlockerSQL reads, on Citus, the coordinator session of the
// distributed transaction the probe's (global pid $1) waits for.
const probeCitusBlockerSQL = `SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.client_addr::text, 'local'),
	coalesce(a.xact_start, now()), coalesce(a.state, ''), now()
FROM citus_lock_waits w
JOIN citus_stat_activity a ON a.global_pid = w.blocking_gpid AND NOT a.is_worker_query
WHERE w.waiting_gpid = $1
ORDER BY a.xact_start
LIMIT 1`

// openOwner is the session that holds a key in flight inside its open
// transaction, as pg_stat_activity (citus_stat_activity) shows it.
type openOwner struct {
	PID             int       `json:"pid"`
	ApplicationName string    `json:"application_name"`
	ClientAddr      string    `json:"client_addr"`
	XactStart       time.Time `json:"transaction_start"`
	State           string    `json:"state"`
	now             time.Time
}

// probeResult is what the probe found: whether another open transaction
// held the key (the insert's bounded wait ran out) and, when the lock views
// named it while the insert waited, its session.
type probeResult struct {
	held  bool
	owner *openOwner
}

// errProbe wraps an error of the probe's insert other than its lock wait
// running out: the probe then knows nothing.
var errProbe = errors.New("unknown whether an open transaction holds the key")

// probeOpenTransaction finds a key held in flight inside another session's
// open transaction, which no query can see: it inserts the key in a
// transaction of its own that it always rolls back, waiting a bounded time,
// while a second session asks which backend the insert waits for
// (pg_blocking_pids(), or Citus's citus_lock_waits).
func probeOpenTransaction(ctx context.Context, pool *pgxpool.Pool, key, user, endpoint string) (probeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, probeWaitCitus+5*time.Second)
	defer cancel()
	prober, err := pool.Acquire(ctx)
	if err != nil {
		return probeResult{}, err
	}
	defer prober.Release()
	watcher, err := pool.Acquire(ctx)
	if err != nil {
		return probeResult{}, err
	}
	defer watcher.Release()
	var (
		id        int64 // the probe's pid, or its global pid on Citus
		citus     bool
		qualified *string
	)
	if err := prober.QueryRow(ctx, probeSetupSQL, table).Scan(&id, &citus, &qualified); err != nil {
		return probeResult{}, err
	}
	if qualified == nil {
		return probeResult{}, fmt.Errorf("no %s table in the search_path", table)
	}
	setup, blocker := []string{probeWaitSQL}, probeBlockerSQL
	if citus {
		if err := prober.QueryRow(ctx, probeGPIDSQL).Scan(&id); err != nil {
			return probeResult{}, err
		}
		setup, blocker = []string{probeCitusSetSQL, probeCitusWaitSQL}, probeCitusBlockerSQL
	}
	tx, err := prober.Begin(ctx)
	if err != nil {
		return probeResult{}, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // the probe never keeps the key
	for _, sql := range setup {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return probeResult{}, err
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, strings.Replace(probeInsertSQL, table, *qualified, 1), key, user, endpoint)
		done <- err
	}()
	return watchProbe(ctx, watcher, blocker, id, done)
}

// watchProbe asks, on watcher, which session the probe's insert waits for
// (blocker, with the probe's id) until the insert ends (done).
func watchProbe(ctx context.Context, watcher *pgxpool.Conn, blocker string, id int64, done <-chan error) (probeResult, error) {
	var owner *openOwner
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			var pgErr *pgconn.PgError
			switch {
			case err == nil: // the insert went through, or met a committed row
				return probeResult{owner: owner, held: owner != nil}, nil
			case errors.As(err, &pgErr) && pgErr.Code == "55P03": // its lock wait ran out
				return probeResult{owner: owner, held: true}, nil
			}
			return probeResult{}, fmt.Errorf("%w: %w", errProbe, err)
		case <-tick.C:
		}
		if owner != nil {
			continue
		}
		var o openOwner
		err := watcher.QueryRow(ctx, blocker, id).Scan(&o.PID, &o.ApplicationName, &o.ClientAddr, &o.XactStart, &o.State, &o.now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return probeResult{}, err
		default:
			owner = &o
		}
	}
}

// printOpenOwner shows the session that holds the key in flight, or that
// one the probe could not identify does.
func (c *cli) printOpenOwner(p probeResult) {
	const what = "in flight inside an open transaction (a transactional route's handler is running): "
	o := p.owner
	if o == nil {
		fmt.Fprintln(c.stdout, what+"held by a session the probe could not identify (its insert waited the whole bound; "+
			"on Citus, look in citus_lock_waits)")
		return
	}
	fmt.Fprintf(c.stdout, what+"held by backend pid %d\n", o.PID)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "app", o.ApplicationName)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "client", o.ClientAddr)
	fmt.Fprintf(c.stdout, "%-10s %s\n", "since", when(o.XactStart, o.now))
	fmt.Fprintf(c.stdout, "%-10s %s\n", "state", o.State)
}
