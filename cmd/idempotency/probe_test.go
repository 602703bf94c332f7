package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const probeEndpoint = "POST /api/trading/orders"

// TestInspectProbeFailureIsNotNothingHeld: a probe whose insert fails for
// another reason than its lock wait (here a trigger refusing it) does not
// know whether an open transaction holds the key, and says so: inspect
// fails instead of printing "no row", which would read as nothing held it.
func TestInspectProbeFailureIsNotNothingHeld(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	// Only the probe's insert: Check's privilege probe inserts too.
	if _, err := db.pool.Exec(t.Context(), `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN
			IF NEW.scope_endpoint = '`+probeEndpoint+`' THEN RAISE EXCEPTION 'probe refused by a trigger'; END IF;
			RETURN NEW;
		END$$;
		CREATE TRIGGER refuse BEFORE INSERT ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	r := runDB(t, db.dsn, "inspect", "--user", "7", "--key", newKey(), "--endpoint", probeEndpoint)
	wantCode(t, r, exitFailure)
	if strings.Contains(r.stdout+r.stderr, "no key ") || !strings.Contains(r.stderr, "probe refused by a trigger") ||
		!strings.Contains(r.stderr, "unknown whether an open transaction holds the key") {
		t.Errorf("inspect whose probe failed:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
	}
}

// citusViews makes, in db's schema, stand-ins for the views Citus gives the
// coordinator (citus_lock_waits, citus_stat_activity, citus_backend_gpid),
// over the plain server's: global pids are the pids plus a billion, and
// every application name is prefixed, so the output shows which views the
// probe read. With empty, citus_lock_waits finds no wait at all, as
// pg_blocking_pids() finds none on a Citus coordinator.
func citusViews(t *testing.T, db testDB, empty bool) {
	t.Helper()
	waits := `SELECT w.pid::bigint + 1000000000 AS waiting_gpid, b.pid::bigint + 1000000000 AS blocking_gpid
		FROM pg_stat_activity w CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)`
	if empty {
		waits += ` WHERE false`
	}
	if _, err := db.pool.Exec(t.Context(), `CREATE VIEW citus_lock_waits AS `+waits+`;
		CREATE VIEW citus_stat_activity AS SELECT pid, 'via citus_stat_activity: ' || application_name AS application_name,
			client_addr, xact_start, state, pid::bigint + 1000000000 AS global_pid, false AS is_worker_query
		FROM pg_stat_activity;
		CREATE FUNCTION citus_backend_gpid() RETURNS bigint LANGUAGE sql AS 'SELECT pg_backend_pid()::bigint + 1000000000'`); err != nil {
		t.Fatal(err)
	}
}

// holdKey claims key in an open transaction of its own, as a transactional
// route's handler holds it, and returns the backend's pid; the transaction
// rolls back when the test ends.
func holdKey(t *testing.T, db testDB, key string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, db.pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	if _, err := conn.Exec(ctx, `SET application_name = 'owner-app'`); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, locked_until, expires_at)
		VALUES ($1, '7', $2, 'h', now() + interval '1 minute', now() + interval '1 hour')`, key, probeEndpoint); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestInspectProbeOnCitus: where the Citus lock views exist, the probe
// finds the owner through them (pg_blocking_pids() is empty on a Citus
// coordinator).
func TestInspectProbeOnCitus(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	citusViews(t, db, false)
	key := newKey()
	pid := holdKey(t, db, key)
	r := runDB(t, db.dsn, "inspect", "--user", "7", "--key", key, "--endpoint", probeEndpoint)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "pid "+strconv.Itoa(pid)) || !strings.Contains(r.stdout, "via citus_stat_activity: owner-app") {
		t.Errorf("inspect on Citus: %s, want the owner's pid %d read from citus_stat_activity", r.stdout, pid)
	}
}

// TestInspectProbeHolderNotFound: when the lock views name no owner but
// the probe's insert still waited its bound out, the key is held by a
// transaction the probe could not identify, never "no row".
func TestInspectProbeHolderNotFound(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	citusViews(t, db, true)
	key := newKey()
	holdKey(t, db, key)
	start := time.Now()
	r := runDB(t, db.dsn, "inspect", "--user", "7", "--key", key, "--endpoint", probeEndpoint)
	wantCode(t, r, exitOK)
	if strings.Contains(r.stdout+r.stderr, "no key ") || !strings.Contains(r.stdout, "could not identify") {
		t.Errorf("inspect with no owner named: %s", r.stdout)
	}
	if d := time.Since(start); d > 5*(probeWaitCitus+probeWait) {
		t.Errorf("inspect took %v: the probe's wait is not bounded", d)
	}
	r = runDB(t, db.dsn, "inspect", "--json", "--user", "7", "--key", key, "--endpoint", probeEndpoint)
	wantCode(t, r, exitOK)
	var out struct {
		Held bool `json:"held_by_unidentified_transaction"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || !out.Held {
		t.Errorf("inspect --json with no owner named: %v\n%s", err, r.stdout)
	}
}

// TestProbeStatements: the SET LOCAL statements bound the probe's insert
// by the waits the code and the help name, and the insert names the table
// once, where the probe qualifies it.
func TestProbeStatements(t *testing.T) {
	if n := strings.Count(probeInsertSQL, table); n != 1 {
		t.Errorf("probeInsertSQL names %s %d times, want once", table, n)
	}
	for sql, want := range map[string]time.Duration{probeWaitSQL: probeWait, probeCitusWaitSQL: probeWaitCitus} {
		m := regexp.MustCompile(`^SET LOCAL lock_timeout = '(\d+)ms'$`).FindStringSubmatch(sql)
		if m == nil {
			t.Fatalf("%q is not SET LOCAL lock_timeout = '<n>ms'", sql)
		}
		if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond != want {
			t.Errorf("%q bounds the wait by something else than %v", sql, want)
		}
	}
}
