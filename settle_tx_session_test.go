package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// Nothing a transactional handler does outlives its request on the
// connection (DESIGN-settled-r3 item 6): after COMMIT the connection goes
// back to the pool as the store found it.

// TestTxNothingOutlivesTheRequest: a handler's plain SET (without LOCAL)
// of search_path, role or a timeout does not outlive its request: every
// connection goes back to the pool as the store found it, so every later
// claim, on every pooled connection, reaches the store's table.
func TestTxNothingOutlivesTheRequest(t *testing.T) {
	t.Parallel()
	const conns = 3
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(conns))
	role := newRole(t, f.pool, `GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`, `GRANT INSERT ON orders TO %s`)
	other := schemaOf(f.pool) + "_other"
	if _, err := f.pool.Exec(context.Background(), `CREATE SCHEMA `+other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP SCHEMA `+other+` CASCADE`) })
	want := sessionSettings(t, f.pool, conns)
	// Every connection serves a handler at once: the first round leaves
	// the record's statements prepared on each, the second changes each
	// session.
	holdAll(t, f, h, conns)
	holdAll(t, f, h, conns, `SET search_path TO `+other, `SET ROLE `+role, `SET statement_timeout = '59min'`,
		`SET lock_timeout = '58min'`, `SET synchronous_commit = off`, `SET idle_in_transaction_session_timeout = '57min'`)
	f.behave = nil
	if got := sessionSettings(t, f.pool, conns); got != want {
		t.Fatalf("the pooled connections after the handlers: %v, want each as before, %v", got, want[0])
	}
	for range 2 * conns {
		if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "201" {
			t.Fatalf("a later claim: %q, want 201", a)
		}
	}
}

// holdAll runs conns requests whose handlers run stmts and wait for each
// other, so each holds a connection of its own, and wants 201 from each.
func holdAll(t *testing.T, f *txFixture, h http.Handler, conns int, stmts ...string) {
	t.Helper()
	in, release := make(chan struct{}, conns), make(chan struct{})
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		for _, s := range stmts {
			if _, err := tx.Exec(r.Context(), s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
		in <- struct{}{}
		<-release
		return false
	}
	answers := make(chan string, conns)
	for range conns {
		go func() { answers <- answerOf(do(h, uuid.NewString(), `{}`)) }()
	}
	for range conns {
		<-in
	}
	close(release)
	for range conns {
		if a := <-answers; a != "201" {
			t.Errorf("a handler that ran %q: %q, want 201", stmts, a)
		}
	}
}

// sessionSettings acquires n connections of pool at once (every one, for
// n its MaxConns) and reads the settings the store depends on from each.
func sessionSettings(t *testing.T, pool *pgxpool.Pool, n int) [3][6]string {
	t.Helper()
	ctx := context.Background()
	var out [3][6]string
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for i := range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var s []string
		if err := c.QueryRow(ctx, `SELECT ARRAY[current_setting('search_path'), current_user::text, current_setting('statement_timeout'),
			current_setting('lock_timeout'), current_setting('synchronous_commit'), current_setting('idle_in_transaction_session_timeout')]`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		out[i] = [6]string(s)
	}
	return out
}

// TestTxSessionStateEveryQueryMode: in every pgx query mode, on a
// connection's first record and after, a handler's SET LOCAL ROLE and
// synchronous_commit and its plain SET search_path neither fail the
// record nor reach the next request on the connection.
func TestTxSessionStateEveryQueryMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1),
				testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
			role := newRole(t, f.pool, `GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`, `GRANT INSERT ON orders TO %s`)
			other := schemaOf(f.pool) + "_other"
			if _, err := f.pool.Exec(context.Background(), `CREATE SCHEMA `+other); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP SCHEMA `+other+` CASCADE`) })
			want := sessionSettings(t, f.pool, 1)
			handlerRuns(t, f, `SET search_path TO `+other, `SET LOCAL ROLE `+role, `SET LOCAL synchronous_commit = off`)
			for i := range 3 {
				key := uuid.NewString()
				if a, b := answerOf(do(h, key, `{}`)), answerOf(do(h, key, `{}`)); a != "201" || b != "201 replayed" {
					t.Fatalf("key %d: %q then %q, want 201 then its replay", i, a, b)
				}
				if got := sessionSettings(t, f.pool, 1); got != want {
					t.Fatalf("key %d: the connection after the route: %v, want %v", i, got, want)
				}
			}
			// Without a key the handler still gets a transaction: the same
			// holds for its COMMIT.
			if a := answerOf(do(h, "", `{}`)); a != "201" {
				t.Fatalf("without a key: %q, want 201", a)
			}
			if got := sessionSettings(t, f.pool, 1); got != want {
				t.Fatalf("without a key: the connection after the route: %v, want %v", got, want)
			}
			if f.calls.Load() != 4 || f.orders(t) != 4 {
				t.Fatalf("executions %d, orders %d; want 4 and 4", f.calls.Load(), f.orders(t))
			}
		})
	}
}

// TestTxHandlerEndedTransactionLeavesNoSession: a handler that ends the
// route's transaction itself (which it must never do) cannot change its
// session afterwards (the call is refused with ErrTxEnded), and passes
// nothing to the next request.
func TestTxHandlerEndedTransactionLeavesNoSession(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1))
	other := schemaOf(f.pool) + "_other"
	if _, err := f.pool.Exec(context.Background(), `CREATE SCHEMA `+other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP SCHEMA `+other+` CASCADE`) })
	want := sessionSettings(t, f.pool, 1)
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `COMMIT`); err != nil {
			t.Error(err)
		}
		if _, err := tx.Exec(r.Context(), `SET search_path TO `+other); !errors.Is(err, idempotency.ErrTxEnded) {
			t.Errorf("SET after COMMIT: %v, want ErrTxEnded", err)
		}
		return false
	}
	if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "503 idempotency_store_unavailable" {
		t.Fatalf("answer %q, want 503 idempotency_store_unavailable (the transaction ended under the handler)", a)
	}
	if got := sessionSettings(t, f.pool, 1); got != want {
		t.Fatalf("the connection after the route: %v, want %v", got, want)
	}
	f.behave = nil
	if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "201" {
		t.Fatalf("the next claim: %q, want 201", a)
	}
}

// TestTxSearchPathAfterAFailedRecord: a record batch that failed drops
// its statements from pgx's cache; the next record on that connection,
// after a handler's SET LOCAL search_path, still finds the store's table.
func TestTxSearchPathAfterAFailedRecord(t *testing.T) {
	t.Parallel()
	f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1))
	warmUp(t, f, h)
	tenant := schemaOf(f.pool) + "_tenant"
	if _, err := f.pool.Exec(context.Background(), `CREATE SCHEMA `+tenant); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP SCHEMA `+tenant+` CASCADE`) })
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		key, _ := idempotency.KeyFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `DELETE FROM idempotency_keys WHERE idem_key = $1`, key); err != nil {
			t.Error(err)
		}
		return false
	}
	if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "409 idempotency_previous_failed" {
		t.Fatalf("a handler that deleted its key's row: %q", a)
	}
	handlerRuns(t, f, `SET LOCAL search_path TO `+tenant)
	key := uuid.NewString()
	if a, b := answerOf(do(h, key, `{}`)), answerOf(do(h, key, `{}`)); a != "201" || b != "201 replayed" {
		t.Fatalf("then a handler's SET LOCAL search_path: %q and %q, want 201 and its replay", a, b)
	}
}
