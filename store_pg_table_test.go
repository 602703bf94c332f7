package idempotency_test

import (
	"context"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresStoreQualifiedTable: once Check has resolved the table, a
// store whose every pooled connection's search_path was then pointed at
// another schema holding an idempotency_keys table of its own (as a
// handler's plain SET search_path leaves it) still sends every statement
// to the resolved table: the whole conformance kit passes, the decoy table
// stays empty, and every statement naming the table names it qualified.
func TestPostgresStoreQualifiedTable(t *testing.T) {
	t.Parallel()
	decoyPool := testdb.New(t, testdb.MaxConns(1))
	decoy := schemaOf(decoyPool)
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		sent := &sqlLog{}
		pool := testdb.New(t, testdb.MaxConns(3), testdb.Tracer(sent))
		s := idempotency.NewPostgresStore(pool)
		if err := s.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
		pointAt(t, pool, decoy)
		sent.reset() // the migrations and the SETs above are the test's
		t.Cleanup(func() { sent.mustQualify(t, schemaOf(pool)) })
		return s
	})
	t.Cleanup(func() { mustBeEmpty(t, decoyPool) })
}

// TestPostgresStoreResolvesWithoutCheck: a store whose Check never ran
// resolves its table once, at its first statement, and keeps it when the
// connections' search_path changes afterwards.
func TestPostgresStoreResolvesWithoutCheck(t *testing.T) {
	t.Parallel()
	decoyPool := testdb.New(t, testdb.MaxConns(1))
	sent := &sqlLog{}
	pool := testdb.New(t, testdb.MaxConns(2), testdb.Tracer(sent))
	sent.reset() // the migrations are the test's
	s := idempotency.NewPostgresStore(pool)
	first := idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
	pointAt(t, pool, schemaOf(decoyPool))
	for range 3 {
		idempotencytest.MustClaim(t, s, idempotencytest.Request("u", time.Hour, time.Minute))
	}
	ctx := t.Context()
	if err := s.Complete(ctx, first.Fence(), first, idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}); err != nil {
		t.Fatalf("Complete after the search_path changed: %v", err)
	}
	mustBeEmpty(t, decoyPool)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schemaOf(pool)+`.idempotency_keys`).Scan(&n); err != nil || n != 4 {
		t.Errorf("resolved table: %d rows (%v), want the 4 claims", n, err)
	}
	sent.mustQualify(t, schemaOf(pool))
	if got := sent.count(regexp.MustCompile(`to_regclass\(\$1\)`)); got != 1 {
		t.Errorf("the table was resolved %d times, want once", got)
	}
}

// TestPostgresTxQualifiedTable: a transactional route's claim and record
// reach the resolved table too, whatever the connections' search_path.
func TestPostgresTxQualifiedTable(t *testing.T) {
	t.Parallel()
	t.Skip("pending the merge with r-tx: BeginClaim's batch and transaction (store_pg_tx.go begin) must be qualified " +
		"with pgPool.resolved, q.batch and pgQualifiedTx (store_pg_table.go); remove this skip then")
	decoyPool := testdb.New(t, testdb.MaxConns(1))
	sent := &sqlLog{}
	pool := testdb.New(t, testdb.MaxConns(2), testdb.Tracer(sent))
	s := idempotency.NewPostgresStore(pool)
	ctx := t.Context()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	pointAt(t, pool, schemaOf(decoyPool))
	sent.reset()
	req := idempotencytest.Request("u", time.Hour, time.Minute)
	tx, res, err := s.BeginClaim(ctx, &req)
	if err != nil || !res.Won {
		t.Fatalf("BeginClaim: won %v, %v", res.Won, err)
	}
	if err := tx.Commit(ctx, &idempotency.Settlement{Fence: res.Record.Fence(),
		Response: idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	mustBeEmpty(t, decoyPool)
	if rec := idempotencytest.Read(t, s, req); rec.Status != idempotency.StatusCompleted {
		t.Errorf("the key reads %s, want completed", rec.Status)
	}
	sent.mustQualify(t, schemaOf(pool))
}

// schemaOf is the schema testdb gave pool.
func schemaOf(pool *pgxpool.Pool) string {
	return pool.Config().ConnConfig.RuntimeParams["search_path"]
}

// pointAt sets, on every connection pool may open, the session's
// search_path to schema, as a handler's plain SET search_path would leave
// a pooled connection.
func pointAt(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		var now string
		if err := c.QueryRow(ctx, `SELECT set_config('search_path', $1, false)`, schema).Scan(&now); err != nil || now != schema {
			t.Fatalf("set search_path: %q, %v", now, err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
}

// mustBeEmpty fails t unless pool's table holds no row.
func mustBeEmpty(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the other schema's table got %d rows (%v): a statement followed the changed search_path", n, err)
	}
}

// sqlLog records every statement a pool sends.
type sqlLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (l *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *sqlLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = nil
}

// tableRef is a reference to the table, with what qualifies it.
var tableRef = regexp.MustCompile(`([\w."]*)\bidempotency_keys\b`)

// mustQualify fails t for a statement that names the table other than as
// schema.idempotency_keys.
func (l *sqlLog) mustQualify(t *testing.T, schema string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.sql {
		for _, m := range tableRef.FindAllStringSubmatch(s, -1) {
			if m[1] != schema+"." {
				t.Errorf("a statement names the table as %q, want %s.idempotency_keys:\n%s", m[0], schema, s)
				return
			}
		}
	}
}

// count returns how many statements match re.
func (l *sqlLog) count(re *regexp.Regexp) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.sql {
		if re.MatchString(s) {
			n++
		}
	}
	return n
}
