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

// TestPostgresTxQualifiedTable: a transactional route's claim, record,
// loser's read, takeover and failed record reach the resolved table too,
// whatever the connections' search_path.
func TestPostgresTxQualifiedTable(t *testing.T) {
	t.Parallel()
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
	abortAtEnd(t, tx)
	if err != nil || !res.Won {
		t.Fatalf("BeginClaim: won %v, %v", res.Won, err)
	}
	if err := tx.Commit(ctx, &idempotency.Settlement{Fence: res.Record.Fence(),
		Response: idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	// The row expires: a second claim loses, reads it and takes it over,
	// then records it failed after undoing to the savepoint.
	if _, err := pool.Exec(ctx, `UPDATE `+schemaOf(pool)+`.idempotency_keys SET expires_at = now() - interval '1s', retain_until = now() - interval '1s'`); err != nil {
		t.Fatal(err)
	}
	tx, res, err = s.BeginClaim(ctx, &req)
	abortAtEnd(t, tx)
	if err != nil || res.Won || res.Record.Status != idempotency.StatusCompleted || !res.Record.Expired {
		t.Fatalf("BeginClaim of the expired key: won %v, %s, expired %v, %v", res.Won, res.Record.Status, res.Record.Expired, err)
	}
	taken, err := tx.Takeover(ctx, res.Record.Fence(), req)
	if err != nil || !taken.Won {
		t.Fatalf("Takeover: won %v, %v", taken.Won, err)
	}
	if err := tx.Commit(ctx, &idempotency.Settlement{Fence: taken.Record.Fence(), Failed: true, Undo: true}); err != nil {
		t.Fatalf("Commit failed: %v", err)
	}
	mustBeEmpty(t, decoyPool)
	if rec := idempotencytest.Read(t, s, req); rec.Status != idempotency.StatusFailed || rec.Attempt != 2 {
		t.Errorf("the key reads %s at attempt %d, want failed at 2", rec.Status, rec.Attempt)
	}
	if n := sent.count(regexp.MustCompile(`^INSERT INTO ` + regexp.QuoteMeta(schemaOf(pool)) + `\.idempotency_keys\b`)); n != 2 {
		t.Errorf("%d transactional claims (pgsql.TxClaimSQL, sent in a batch) seen qualified, want 2", n)
	}
	sent.mustQualify(t, schemaOf(pool))
}

// abortAtEnd ends tx (nil: none) when the test ends, so that a test that
// failed with it open still gives its connection back (a no-op once it
// committed).
func abortAtEnd(t *testing.T, tx idempotency.RouteTx) {
	if tx != nil {
		t.Cleanup(func() { _ = tx.Abort(context.Background()) })
	}
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

// sqlLog records every statement a pool sends, alone or in a batch.
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

// TraceBatchQuery records each statement of a batch, as its result is read.
func (l *sqlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
}

func (l *sqlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

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
