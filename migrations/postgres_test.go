package migrations_test

import (
	"context"
	"errors"
	"io/fs"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/idemkit/idempotency/internal/pgmigrate"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// latest is the PostgreSQL migrations' last version: 000001, then
// round 4's 000002 (its ALTER TABLE) and the statements that cannot share
// that file (Citus): 000003 the retain_until backfill, 000004 and 000005
// its indexes.
const latest = 5

// TestPostgresMigrations runs the PostgreSQL migrations up and down on a
// real database: their history, their lock, and what a cancelled or
// failed run leaves behind.
func TestPostgresMigrations(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	version := func(t *testing.T, pool *pgxpool.Pool) (int64, bool) {
		t.Helper()
		var v int64
		var dirty bool
		err := pool.QueryRow(ctx, `SELECT version, dirty FROM idempotency_schema_migrations`).Scan(&v, &dirty)
		if err != nil {
			t.Fatalf("read history: %v", err)
		}
		return v, dirty
	}
	tableExists := func(t *testing.T, pool *pgxpool.Pool, name string) bool {
		t.Helper()
		var ok bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`, name).Scan(&ok)
		if err != nil {
			t.Fatalf("look for table %s: %v", name, err)
		}
		return ok
	}

	t.Run("UpOnEmptySchemaThenNoOp", func(t *testing.T) {
		t.Parallel()
		pool := testdb.NewEmpty(t)
		if tableExists(t, pool, "idempotency_keys") {
			t.Fatal("the empty schema already has idempotency_keys")
		}
		if err := migrations.Migrate(ctx, pool); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if !tableExists(t, pool, "idempotency_keys") {
			t.Fatal("no idempotency_keys after Migrate")
		}
		if v, dirty := version(t, pool); v != latest || dirty {
			t.Fatalf("history: version %d dirty %v, want %d clean", v, dirty, latest)
		}
		if err := migrations.Migrate(ctx, pool); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		if v, dirty := version(t, pool); v != latest || dirty {
			t.Fatalf("history after the second Migrate: version %d dirty %v, want %d clean", v, dirty, latest)
		}
		if tableExists(t, pool, "schema_migrations") {
			t.Fatal("Migrate created schema_migrations, the host's history table")
		}
	})

	t.Run("HostSchemaMigrationsUntouched", func(t *testing.T) {
		t.Parallel()
		pool := testdb.NewEmpty(t)
		_, err := pool.Exec(ctx, `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
			INSERT INTO schema_migrations VALUES (20240101120000, false)`)
		if err != nil {
			t.Fatalf("create the host's history: %v", err)
		}
		if err := migrations.Migrate(ctx, pool); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		rows, err := pool.Query(ctx, `SELECT version, dirty FROM schema_migrations`)
		if err != nil {
			t.Fatalf("read the host's history: %v", err)
		}
		type row struct {
			Version int64
			Dirty   bool
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatalf("read the host's history: %v", err)
		}
		if len(got) != 1 || got[0] != (row{20240101120000, false}) {
			t.Fatalf("host's schema_migrations = %+v, want only {20240101120000 false}", got)
		}
	})

	t.Run("DownDropsEverything", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		m, err := pgmigrate.New(ctx, pool, migrations.FS)
		if err != nil {
			t.Fatalf("pgmigrate.New: %v", err)
		}
		defer func() {
			if err := m.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
		var (
			v     uint
			dirty bool
		)
		if err := m.Run(ctx, func(m *migrate.Migrate) (err error) { v, dirty, err = m.Version(); return err }); err != nil || v != latest || dirty {
			t.Fatalf("Version = %d %v %v, want %d clean", v, dirty, err, latest)
		}
		if err := m.Run(ctx, func(m *migrate.Migrate) error { return m.Down() }); err != nil {
			t.Fatalf("Down: %v", err)
		}
		var n int
		err = pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
			 WHERE ns.nspname = current_schema() AND c.relname <> 'idempotency_schema_migrations'
			   AND c.relname NOT LIKE 'idempotency_schema_migrations_%')
			+ (SELECT count(*) FROM pg_constraint WHERE connamespace = current_schema()::regnamespace AND conrelid <> 'idempotency_schema_migrations'::regclass)`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("after Down, %d relations or constraints remain besides the history table", n)
		}
		// Up again restores the table.
		if err := m.Up(ctx); err != nil {
			t.Fatalf("Up after Down: %v", err)
		}
		if !tableExists(t, pool, "idempotency_keys") {
			t.Fatal("no idempotency_keys after Up")
		}
	})

	t.Run("Round4BackfillsRetainUntil", func(t *testing.T) {
		t.Parallel()
		pool := testdb.NewEmpty(t)
		m, err := pgmigrate.New(ctx, pool, migrations.FS)
		if err != nil {
			t.Fatalf("pgmigrate.New: %v", err)
		}
		defer func() {
			if err := m.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
		if err := m.Run(ctx, func(m *migrate.Migrate) error { return m.Migrate(1) }); err != nil {
			t.Fatalf("migrate to version 1: %v", err)
		}
		_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, locked_until, expires_at)
			VALUES ('k', 'e', '', now(), now() + interval '1 hour')`)
		if err != nil {
			t.Fatalf("a version-1 row: %v", err)
		}
		if err := m.Up(ctx); err != nil {
			t.Fatalf("Up from version 1: %v", err)
		}
		var same bool
		if err := pool.QueryRow(ctx, `SELECT retain_until = expires_at FROM idempotency_keys WHERE idem_key = 'k'`).Scan(&same); err != nil || !same {
			t.Fatalf("the version-1 row's retain_until = expires_at: %v (%v), want true", same, err)
		}
		// A binary of version 1 writes no retain_until: the default, read as
		// "deleted at expiry" (pgsql.ExpiredBatchSQL reads expires_at too).
		_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, locked_until, expires_at)
			VALUES ('old-binary', 'e', '', now(), now() + interval '1 hour')`)
		if err != nil {
			t.Fatalf("a row written as version 1 writes it: %v", err)
		}
	})

	t.Run("SentinelComment", func(t *testing.T) {
		t.Parallel()
		names, err := fs.Glob(migrations.FS, "*.sql")
		if err != nil || len(names) != 2*latest {
			t.Fatalf("embedded migrations %v (%v), want %d files", names, err, 2*latest)
		}
		for _, name := range names {
			b, err := fs.ReadFile(migrations.FS, name)
			if err != nil {
				t.Fatalf("embedded %s: %v", name, err)
			}
			if !strings.HasPrefix(string(b), "-- POSTGRES-ONLY\n") {
				t.Errorf("%s does not start with the -- POSTGRES-ONLY sentinel", name)
			}
		}
	})

	t.Run("SchemaDefinition", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)

		var conDef string
		err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
			JOIN pg_namespace ns ON ns.oid = c.connamespace
			WHERE ns.nspname = current_schema() AND c.conname = 'uq_idem_key_user_endpoint' AND c.contype = 'p'`).Scan(&conDef)
		if err != nil {
			t.Fatalf("primary key uq_idem_key_user_endpoint: %v", err)
		}
		if want := "PRIMARY KEY (scope_user_id, idem_key, scope_endpoint)"; conDef != want {
			t.Errorf("uq_idem_key_user_endpoint = %q, want %q", conDef, want)
		}

		var check string
		err = pool.QueryRow(ctx, `SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
			JOIN pg_namespace ns ON ns.oid = c.connamespace
			WHERE ns.nspname = current_schema() AND c.conrelid = 'idempotency_keys'::regclass AND c.contype = 'c'`).Scan(&check)
		if err != nil {
			t.Fatalf("status check constraint: %v", err)
		}
		for _, s := range []string{"in_flight", "completed", "failed"} {
			if !strings.Contains(check, "'"+s+"'") {
				t.Errorf("status check %q does not allow %s", check, s)
			}
		}

		// The primary key, idx_idem_keys_expires, idx_idem_keys_retain and the
		// partial idx_idem_keys_purge, and no other index: each costs every
		// claim an insertion (docs/storage.md; the partial one only a claim
		// of an ExpiredRefuse route, at its record).
		var nIndexes int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'idempotency_keys'`).Scan(&nIndexes); err != nil || nIndexes != 4 {
			t.Errorf("idempotency_keys has %d indexes (err %v), want 4: the primary key, idx_idem_keys_expires, idx_idem_keys_retain, idx_idem_keys_purge", nIndexes, err)
		}
		indexes := map[string]string{
			"idx_idem_keys_expires": "CREATE INDEX idx_idem_keys_expires ON %s.idempotency_keys USING btree (expires_at)",
			"idx_idem_keys_retain":  "CREATE INDEX idx_idem_keys_retain ON %s.idempotency_keys USING btree (retain_until)",
			"idx_idem_keys_purge":   "CREATE INDEX idx_idem_keys_purge ON %s.idempotency_keys USING btree (expires_at) WHERE ((retain_until > expires_at) AND (NOT purged))",
		}
		for name, want := range indexes {
			var schema, def string
			err := pool.QueryRow(ctx, `SELECT schemaname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND indexname = $1`, name).Scan(&schema, &def)
			if err != nil {
				t.Errorf("index %s: %v", name, err)
				continue
			}
			if want := strings.Replace(want, "%s", schema, 1); def != want {
				t.Errorf("index %s:\n got  %s\n want %s", name, def, want)
			}
		}

		// The record (pgsql.CompleteSQL) must stay a HOT update: an index
		// naming a column it writes, in its key or its predicate, makes
		// PostgreSQL write every record as a new tuple with an entry in every
		// index (BENCHMARKS.md, "Where a new key's time goes").
		written := recordWrites(t)
		defs, err := pool.Query(ctx, `SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'idempotency_keys'`)
		if err != nil {
			t.Fatal(err)
		}
		type index struct{ Name, Def string }
		all, err := pgx.CollectRows(defs, pgx.RowToStructByPos[index])
		if err != nil {
			t.Fatal(err)
		}
		for _, ix := range all {
			for _, col := range written {
				if regexp.MustCompile(`\b` + col + `\b`).MatchString(ix.Def) {
					t.Errorf("index %s names %s, which the record writes: every record is a non-HOT update\n%s", ix.Name, col, ix.Def)
				}
			}
		}

		type column struct {
			Name, Type, Nullable string
			Default              *string
		}
		rows, err := pool.Query(ctx, `SELECT column_name::text, data_type::text, is_nullable::text, column_default::text
			FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' ORDER BY ordinal_position`)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
		if err != nil {
			t.Fatal(err)
		}
		str := func(s string) *string { return &s }
		want := []column{
			{"id", "bigint", "NO", str("nextval('idempotency_keys_id_seq'::regclass)")},
			{"idem_key", "text", "NO", nil},
			{"scope_user_id", "text", "NO", str("''::text")},
			{"scope_endpoint", "text", "NO", nil},
			{"request_hash", "bytea", "NO", nil},
			{"response_code", "smallint", "YES", nil},
			{"response_body", "bytea", "YES", nil},
			{"response_body_raw", "bytea", "YES", nil},
			{"response_headers", "bytea", "YES", nil},
			{"seal_key_id", "text", "YES", nil},
			{"status", "text", "NO", str("'in_flight'::text")},
			{"attempt", "integer", "NO", str("1")},
			{"created_at", "timestamp with time zone", "NO", str("now()")},
			{"locked_at", "timestamp with time zone", "NO", str("now()")},
			{"locked_until", "timestamp with time zone", "NO", nil},
			{"expires_at", "timestamp with time zone", "NO", nil},
			{"owner_token", "uuid", "YES", nil},
			{"derive_key_id", "text", "NO", str("''::text")}, // 000002_round4
			{"retain_until", "timestamp with time zone", "NO", str("'-infinity'::timestamp with time zone")},
			{"purged", "boolean", "NO", str("false")},
		}
		if len(cols) != len(want) {
			t.Fatalf("idempotency_keys has %d columns, want %d: %+v", len(cols), len(want), cols)
		}
		deref := func(p *string) string {
			if p == nil {
				return "<none>"
			}
			return *p
		}
		for i, w := range want {
			g := cols[i]
			if g.Name != w.Name || g.Type != w.Type || g.Nullable != w.Nullable || deref(g.Default) != deref(w.Default) {
				t.Errorf("column %d = %s %s nullable=%s default=%s, want %s %s nullable=%s default=%s",
					i+1, g.Name, g.Type, g.Nullable, deref(g.Default), w.Name, w.Type, w.Nullable, deref(w.Default))
			}
		}
		var fks int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'idempotency_keys'::regclass AND contype = 'f'`).Scan(&fks); err != nil || fks != 0 {
			t.Errorf("foreign keys on idempotency_keys: %d (err %v), want none", fks, err)
		}
	})

	t.Run("ConcurrentSchemas", func(t *testing.T) {
		t.Parallel()
		// Separate schemas migrate at once without waiting for each other's
		// advisory lock; callers sharing one schema apply it once.
		var pools []*pgxpool.Pool
		for range 4 {
			pools = append(pools, testdb.NewEmpty(t, testdb.MaxConns(3)))
		}
		pools = append(pools, pools[0], pools[0], pools[1])
		errs := make([]error, len(pools))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, p := range pools {
			wg.Go(func() {
				<-start
				errs[i] = migrations.Migrate(ctx, p)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Migrate %d: %v", i, err)
			}
		}
		for i, p := range pools[:4] {
			if v, dirty := version(t, p); v != latest || dirty {
				t.Errorf("schema %d: version %d dirty %v, want %d clean", i, v, dirty, latest)
			}
		}
	})

	t.Run("LockWaitEndsWithContext", func(t *testing.T) {
		t.Parallel()
		for _, migrated := range []bool{false, true} {
			pool := testdb.NewEmpty(t)
			if migrated {
				if err := migrations.Migrate(ctx, pool); err != nil {
					t.Fatal(err)
				}
			}
			// Another migrator holds golang-migrate's lock for this schema.
			var dbName, schema string
			if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&dbName, &schema); err != nil {
				t.Fatal(err)
			}
			id, err := database.GenerateAdvisoryLockId(dbName, schema, pgmigrate.HistoryTable)
			if err != nil {
				t.Fatal(err)
			}
			holder, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1::text::bigint)`, id); err != nil {
				t.Fatal(err)
			}

			const deadline = 300 * time.Millisecond
			wait, cancel := context.WithTimeout(ctx, deadline)
			start := time.Now()
			err = migrations.Migrate(wait, pool)
			elapsed := time.Since(start)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Migrate (migrated %v) while the lock is held: %v, want context.DeadlineExceeded", migrated, err)
			}
			if elapsed > 5*deadline {
				t.Errorf("Migrate (migrated %v) while the lock is held took %v, want at most %v", migrated, elapsed, 5*deadline)
			}

			if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1::text::bigint)`, id); err != nil {
				t.Fatal(err)
			}
			holder.Release()
			// The abandoned lock request left nothing behind: the lock is
			// free (once the server has processed the cancel request), and
			// Migrate now runs.
			var free bool
			for poll := time.Now(); !free; {
				err = pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
					if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::text::bigint)`, id).Scan(&free); err != nil {
						return err
					}
					_, err := c.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if !free && time.Since(poll) > 5*time.Second {
					t.Fatal("the abandoned lock request still holds the lock after 5s")
				}
			}
			if err := migrations.Migrate(ctx, pool); err != nil {
				t.Fatalf("Migrate once the lock is free: %v", err)
			}
			if v, dirty := version(t, pool); v != latest || dirty {
				t.Fatalf("version %d dirty %v, want %d clean", v, dirty, latest)
			}
		}
	})

	t.Run("DoneContext", func(t *testing.T) {
		t.Parallel()
		pool := testdb.NewEmpty(t)
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := migrations.Migrate(done, pool); !errors.Is(err, context.Canceled) {
			t.Fatalf("Migrate with a cancelled context: %v, want context.Canceled", err)
		}
		if tableExists(t, pool, "idempotency_keys") {
			t.Fatal("Migrate with a cancelled context created the table")
		}
	})
}

// recordWrites are the columns pgsql.CompleteSQL sets, read off its SET
// list.
func recordWrites(t *testing.T) []string {
	t.Helper()
	set, _, ok := strings.Cut(pgsql.CompleteSQL, "\nWHERE")
	_, set, ok2 := strings.Cut(set, " SET")
	if !ok || !ok2 {
		t.Fatalf("pgsql.CompleteSQL has no SET ... WHERE: %s", pgsql.CompleteSQL)
	}
	var cols []string
	for _, a := range strings.Split(set, ",") {
		col, _, _ := strings.Cut(strings.TrimSpace(a), " ")
		cols = append(cols, col)
	}
	if len(cols) < 6 {
		t.Fatalf("read %v off pgsql.CompleteSQL's SET list", cols)
	}
	return cols
}
