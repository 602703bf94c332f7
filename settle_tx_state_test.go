package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// What a handler does to its transaction's session state (DESIGN.md "Safe
// as deployed": what a handler does to its transaction never loops, and
// nothing it does outlives its request on the connection).

// newRole creates a role without login, dropped (with its grants) when the
// test ends, and runs the grants given (with %s for the role's name).
func newRole(t *testing.T, pool *pgxpool.Pool, grants ...string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	role := "idem_app_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	for _, g := range grants {
		if _, err := pool.Exec(ctx, fmt.Sprintf(g, role)); err != nil {
			t.Fatal(err)
		}
	}
	return role
}

// handlerRuns makes the fixture's handler run stmts through its
// transaction after writing its order, and answer 201.
func handlerRuns(t *testing.T, f *txFixture, stmts ...string) {
	f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
		tx, _ := idempotency.TxFromContext(r.Context())
		for _, s := range stmts {
			if _, err := tx.Exec(r.Context(), s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
		return false
	}
}

// TestTxHandlerStateNeverLoops: whatever state a handler leaves its
// transaction in, three requests with one key execute once and answer as
// the contract says: a state the store can undo (a role without rights on
// the store's table, another search_path, a pgx.Rows left open) commits
// and replays; one it cannot (a read-only transaction, a deferred trigger
// raising its own error) rolls back to the savepoint and records the key
// failed. It used to be 503 on every request, each one running the
// handler again.
func TestTxHandlerStateNeverLoops(t *testing.T) {
	t.Parallel()
	replays := []string{"201", "201 replayed", "201 replayed"}
	failed := []string{"409 idempotency_previous_failed", "409 idempotency_previous_failed", "409 idempotency_previous_failed"}
	for _, c := range []struct {
		name   string
		setup  func(t *testing.T, f *txFixture)
		want   []string
		orders int
	}{
		{"SET LOCAL ROLE without rights on the store's table", func(t *testing.T, f *txFixture) {
			role := newRole(t, f.pool, `GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`)
			handlerRuns(t, f, `SET LOCAL ROLE `+role)
		}, replays, 1},
		{"SET LOCAL search_path to a tenant's schema", func(t *testing.T, f *txFixture) {
			tenant := schemaOf(f.pool) + "_tenant"
			if _, err := f.pool.Exec(context.Background(), `CREATE SCHEMA `+tenant); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = f.pool.Exec(context.Background(), `DROP SCHEMA `+tenant+` CASCADE`) })
			handlerRuns(t, f, `SET LOCAL search_path TO `+tenant)
		}, replays, 1},
		{"a pgx.Rows left open", func(t *testing.T, f *txFixture) {
			f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				rows, err := tx.Query(r.Context(), `SELECT generate_series(1, 3)`)
				if err != nil || !rows.Next() {
					t.Errorf("query: %v", err)
				}
				return false // rows never closed
			}
		}, replays, 1},
		{"a QueryRow never scanned", func(t *testing.T, f *txFixture) {
			f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				_ = tx.QueryRow(r.Context(), `SELECT 1`) // never scanned
				return false
			}
		}, replays, 1},
		{"SET LOCAL transaction_read_only", func(t *testing.T, f *txFixture) {
			handlerRuns(t, f, `SET LOCAL transaction_read_only = on`)
		}, failed, 0},
		{"a deferred trigger raising its own error", func(t *testing.T, f *txFixture) {
			if _, err := f.pool.Exec(context.Background(), `
				CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN RAISE EXCEPTION 'orders are closed'; END $$;
				CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON orders
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
				t.Fatal(err)
			}
		}, failed, 0},
		{"the handler deletes its key's row", func(t *testing.T, f *txFixture) {
			f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				key, _ := idempotency.KeyFromContext(r.Context())
				if _, err := tx.Exec(r.Context(), `DELETE FROM idempotency_keys WHERE idem_key = $1`, key); err != nil {
					t.Error(err)
				}
				return false
			}
		}, failed, 0},
	} {
		for _, warm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/warm=%v", c.name, warm), func(t *testing.T) {
				t.Parallel()
				f, h := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(1))
				if warm {
					warmUp(t, f, h)
				}
				c.setup(t, f)
				key := uuid.NewString()
				var got []string
				for range 3 {
					got = append(got, answerOf(do(h, key, `{}`)))
				}
				if strings.Join(got, ", ") != strings.Join(c.want, ", ") || f.calls.Load() != 1 || f.orders(t) != c.orders {
					t.Fatalf("answers %q, executions %d, orders %d; want %q, 1 and %d", got, f.calls.Load(), f.orders(t), c.want, c.orders)
				}
				if n := gathered(t, f.reg, "idempotency_record_failures_total", "orders"); n != 0 {
					t.Errorf("record failures = %v, want 0", n)
				}
			})
		}
	}
}

// warmUp runs one request through each of the fixture's connections (one
// at a time: a pool of one), as every connection of a running server has
// served requests: its statements are prepared. It forgets that run.
func warmUp(t *testing.T, f *txFixture, h http.Handler) {
	t.Helper()
	if a := answerOf(do(h, uuid.NewString(), `{}`)); a != "201" {
		t.Fatalf("warm-up: %s", a)
	}
	f.calls.Store(0)
	if _, err := f.pool.Exec(context.Background(), `DELETE FROM orders`); err != nil {
		t.Fatal(err)
	}
}

// answerOf summarises an answer: its status, "replayed" for a replay, and
// the error code of a middleware error.
func answerOf(w *httptest.ResponseRecorder) string {
	s := fmt.Sprint(w.Code)
	if w.Header().Get(idempotency.HeaderReplayed) == "true" {
		s += " replayed"
	}
	for _, code := range []string{"idempotency_previous_failed", "idempotency_in_flight", "idempotency_store_unavailable"} {
		if strings.Contains(w.Body.String(), code) {
			s += " " + code
		}
	}
	return s
}

// TestTxRecordUnwritable: a store whose own record cannot be written (its
// role lacks UPDATE on the table) rolls everything back: 503, an ERROR
// log, idempotency_record_failures_total; nothing the handler wrote
// commits.
func TestTxRecordUnwritable(t *testing.T) {
	t.Parallel()
	f, _ := newTxFixture(t, idempotency.Config{}, idempotency.RouteConfig{}, testdb.MaxConns(2))
	role := newRole(t, f.pool,
		`GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`,
		`GRANT SELECT, INSERT, DELETE ON idempotency_keys TO %s`,
		`GRANT USAGE ON SEQUENCE idempotency_keys_id_seq TO %s`,
		`GRANT INSERT, SELECT ON orders TO %s`,
		`GRANT USAGE ON SEQUENCE orders_id_seq TO %s`)
	cfg := f.pool.Config().Copy()
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SET ROLE `+role)
		return err
	}
	limited, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(limited.Close)
	logs := &logBuffer{}
	f.reg = prometheus.NewRegistry()
	h := f.route(t, limited, idempotency.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, idempotency.RouteConfig{})
	key := uuid.NewString()
	if got := answerOf(do(h, key, `{}`)); got != "503 idempotency_store_unavailable" {
		t.Fatalf("answer %q, want 503", got)
	}
	if n := gathered(t, f.reg, "idempotency_record_failures_total", "orders"); n != 1 {
		t.Errorf("record failures = %v, want 1", n)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || f.orders(t) != 0 {
		t.Errorf("orders %d, logs:\n%s\nwant 0 and an ERROR", f.orders(t), logs)
	}
}

// settingsTrigger makes every order note, when its deferred trigger fires
// (SET CONSTRAINTS ALL IMMEDIATE, just before the record and COMMIT), the
// settings in force then. It returns how to read the note of a key.
func settingsTrigger(t *testing.T, f *txFixture) func(key string) [6]string {
	t.Helper()
	s := schemaOf(f.pool)
	if _, err := f.pool.Exec(context.Background(), `
		CREATE TABLE seen (idem_key TEXT, settings TEXT[]);
		CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO `+s+`.seen VALUES (NEW.idem_key, ARRAY[current_setting('role'), current_setting('search_path'),
				current_setting('synchronous_commit'), current_setting('statement_timeout'), current_setting('lock_timeout'),
				current_setting('idle_in_transaction_session_timeout')]);
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER note AFTER INSERT ON orders
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note()`); err != nil {
		t.Fatal(err)
	}
	return func(key string) [6]string {
		t.Helper()
		var got []string
		if err := f.pool.QueryRow(context.Background(), `SELECT settings FROM seen WHERE idem_key = $1`, key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return [6]string(got)
	}
}

// TestTxRecordRunsWithClaimTimeState: the record and COMMIT run with the
// settings in force at the claim, whatever the handler set with SET LOCAL:
// no synchronous_commit = off reaches the COMMIT, no timeout of its own
// bounds (or unbounds) the record, and role and search_path are the
// session's again.
func TestTxRecordRunsWithClaimTimeState(t *testing.T) {
	t.Parallel()
	// Cold, a connection's first record: its statement is parsed before
	// the batch runs. Warm, the record's statement is prepared.
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			t.Parallel()
			session := testdb.Configure(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "7s" })
			f, h := newTxFixture(t, idempotency.Config{Lease: 12 * time.Second}, idempotency.RouteConfig{}, session, testdb.MaxConns(1))
			seen := settingsTrigger(t, f)
			if warm {
				warmUp(t, f, h)
			}
			role := newRole(t, f.pool, `GRANT USAGE ON SCHEMA `+schemaOf(f.pool)+` TO %s`, `GRANT INSERT ON orders TO %s`)
			handlerRuns(t, f, `SET LOCAL ROLE `+role, `SET LOCAL search_path TO public`, `SET LOCAL synchronous_commit = off`,
				`SET LOCAL statement_timeout = 0`, `SET LOCAL lock_timeout = '1ms'`, `SET LOCAL idle_in_transaction_session_timeout = 0`)
			key := uuid.NewString()
			if got := answerOf(do(h, key, `{}`)); got != "201" {
				t.Fatalf("answer %q", got)
			}
			if got, want := seen(key), [6]string{"none", schemaOf(f.pool), "on", "12s", "7s", "12s"}; got != want {
				t.Fatalf("role, search_path, synchronous_commit, statement_timeout, lock_timeout, idle_in_transaction_session_timeout "+
					"at the record: %q, want %q", got, want)
			}
		})
	}
}

// TestTxClaimKeepsTighterHostBounds: the claim bounds statement_timeout
// and idle_in_transaction_session_timeout by the lease, but never loosens
// a bound the host set tighter; 0 (no bound) counts as the largest.
func TestTxClaimKeepsTighterHostBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		statement, idle string // the session's
		want            [2]string
	}{
		{"3s", "0", [2]string{"3s", "12s"}},
		{"0", "2s", [2]string{"12s", "2s"}},
		{"1min", "1h", [2]string{"12s", "12s"}},
		{"12s", "12000ms", [2]string{"12s", "12s"}},
	} {
		t.Run(c.statement+"/"+c.idle, func(t *testing.T) {
			t.Parallel()
			session := testdb.Configure(func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["statement_timeout"] = c.statement
				cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = c.idle
			})
			f, h := newTxFixture(t, idempotency.Config{Lease: 12 * time.Second}, idempotency.RouteConfig{}, session)
			got := make(chan [2]string, 1)
			f.behave = func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
				tx, _ := idempotency.TxFromContext(r.Context())
				var s [2]string
				if err := tx.QueryRow(r.Context(), `SELECT current_setting('statement_timeout'),
					current_setting('idle_in_transaction_session_timeout')`).Scan(&s[0], &s[1]); err != nil {
					t.Error(err)
				}
				got <- s
				return false
			}
			if w := do(h, uuid.NewString(), `{}`); w.Code != http.StatusCreated {
				t.Fatalf("answer %d %s", w.Code, w.Body)
			}
			if s := <-got; s != c.want {
				t.Fatalf("session %s/%s: the handler ran under statement_timeout %s, idle_in_transaction_session_timeout %s; want %s and %s",
					c.statement, c.idle, s[0], s[1], c.want[0], c.want[1])
			}
		})
	}
}
