package idempotency_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestGroupCommitPlansUseTheKey: under the settings every batch's
// transaction runs with, the batch statements' generic plans (the plans a
// connection keeps once PostgreSQL stops planning each call) read rows by
// the primary key, even planned on an empty table. Without them the
// record's plan scanned the whole table on every batch while the table
// grew: the bench saw 4,059 scans read 59 million rows in 20 s at 16
// clients, and PostgreSQL's CPU per new key triple.
func TestGroupCommitPlansUseTheKey(t *testing.T) {
	pool := testdb.New(t, testdb.MaxConns(1))
	ctx := t.Context()
	for name, c := range map[string]struct {
		sql    string
		params int
	}{
		"claim":  {pgsql.ClaimBatchSQL, 9},
		"record": {pgsql.CompleteBatchSQL, 10},
	} {
		t.Run(name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // the test reads only
			// The round's settings, force_generic_plan among them.
			if _, err := tx.Exec(ctx, pgsql.RoundSettingsSQL, idempotency.RoundLockWaitForTest); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "PREPARE batch_"+name+" AS "+c.sql); err != nil {
				t.Fatal(err)
			}
			nulls := strings.TrimSuffix(strings.Repeat("NULL, ", c.params), ", ")
			rows, err := tx.Query(ctx, "EXPLAIN EXECUTE batch_"+name+"("+nulls+")")
			if err != nil {
				t.Fatal(err)
			}
			var plan strings.Builder
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan.WriteString(line + "\n")
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if p := plan.String(); strings.Contains(p, "Seq Scan on idempotency_keys") ||
				!strings.Contains(p, "Index Scan using uq_idem_key_user_endpoint") {
				t.Errorf("the generic plan does not find rows by the primary key:\n%s", p)
			}
		})
	}
}

// planCounts sums, over pool's idle connections, the plans PostgreSQL made
// for the statements pgx prepared on them that contain marker: generic
// (planned once, kept) and custom (planned afresh for each call). A
// round's arrays are small and their sizes known when planned for the
// call, so PostgreSQL would find custom plans cheaper and plan every round
// again: the bench saw a third of PostgreSQL's CPU per new key go to
// planning at 16 clients.
func planCounts(t *testing.T, pool *pgxpool.Pool, marker string) (generic, custom int64) {
	t.Helper()
	for _, c := range pool.AcquireAllIdle(t.Context()) {
		var g, cu int64
		err := c.QueryRow(t.Context(), `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
			FROM pg_prepared_statements WHERE strpos(statement, $1) > 0`, marker).Scan(&g, &cu)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
		generic, custom = generic+g, custom+cu
	}
	return generic, custom
}

// TestPlanSettingsFromPG12: the plan settings (a round's kept plans,
// sqlstore cleanup's plans for the call) are made on PostgreSQL 12 or
// newer, where plan_cache_mode exists, and only there. Each sets its
// settings here for the transaction alone (a round's also its lock wait
// and no sequential scans); the same statement asking for a version this
// server is not, and naming a setting it does not know, runs without
// error: on an older server set_config is never called.
func TestPlanSettingsFromPG12(t *testing.T) {
	pool := testdb.New(t, testdb.MaxConns(1))
	ctx := t.Context()
	const settings = `SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'), current_setting('lock_timeout')`
	var session [3]string // plan_cache_mode, enable_seqscan, lock_timeout as the role and database leave them
	if err := pool.QueryRow(ctx, settings).Scan(&session[0], &session[1], &session[2]); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql  string
		args []any
		want [3]string // in the transaction
	}{
		{pgsql.RoundSettingsSQL, []any{"1234ms"}, [3]string{"force_generic_plan", "off", "1234ms"}},
		{pgsql.CustomPlanSQL, nil, [3]string{"force_custom_plan", session[1], session[2]}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got, after [3]string
		if _, err := tx.Exec(ctx, c.sql, c.args...); err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		if err := tx.QueryRow(ctx, settings).Scan(&got[0], &got[1], &got[2]); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: %q in its transaction, want %q", c.sql, got, c.want)
		}
		if err := pool.QueryRow(ctx, settings).Scan(&after[0], &after[1], &after[2]); err != nil || after != session {
			t.Errorf("%s: %q after its transaction (%v), want the session's %q", c.sql, after, err, session)
		}
		old := strings.NewReplacer("120000", "9900000", "'plan_cache_mode'", "'no_such_setting'").Replace(c.sql)
		if old == c.sql || !strings.Contains(old, "no_such_setting") {
			t.Fatalf("%s no longer names the version and the setting this test replaces", c.sql)
		}
		if _, err := pool.Exec(ctx, old, c.args...); err != nil {
			t.Errorf("%s on a server older than it asks for: %v", old, err)
		}
	}
}
