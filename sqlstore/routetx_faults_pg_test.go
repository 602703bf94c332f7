package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/sqlstore"
)

// TestPostgresRowErrWithoutScan: TestMySQLRowErrWithoutScan on both
// drivers.
func TestPostgresRowErrWithoutScan(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, _ := pgDB(t, driver, 2)
			exec(t, db, "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, symbol TEXT NOT NULL)")
			rowErrWithoutScan(t, pgStore(t, db), db, "INSERT INTO orders (symbol) VALUES ('AAPL')")
		})
	}
}

// TestPostgresTxRoutesReuseConnections: sequential transactional requests
// run on one pooled connection, on both drivers (issue 33, review F9:
// lib/pq closed its connection after every one, COMMIT through ExecContext
// then database/sql's Rollback marking it bad).
func TestPostgresTxRoutesReuseConnections(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, _ := pgDB(t, driver, 1)
			s := pgStore(t, db)
			pids := map[int]bool{}
			h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
				tx, _ := sqlstore.TxFromContext(r.Context())
				var pid int
				if err := tx.QueryRowContext(r.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Errorf("pg_backend_pid: %v", err)
				}
				pids[pid] = true
				w.WriteHeader(http.StatusCreated)
			})
			for range 5 {
				if code, body, _ := post(t, h, uuid.NewString(), "x"); code != http.StatusCreated {
					t.Fatalf("order: %d %s", code, body)
				}
			}
			if len(pids) != 1 {
				t.Fatalf("5 requests on a pool of one ran on %d backends, want 1: the connection was closed after a request", len(pids))
			}
		})
	}
}

// TestPostgresHandlerRoleStaysInTheRoute: a handler's SET LOCAL ROLE to a
// role without grants on the idempotency table does not break the record
// (the order is 201 and recorded, the retry replays), and a handler's SET
// ROLE does not outlive the route: the next request on the pooled
// connection runs as the pool's own role (issue 33, "Session state stays
// in the route").
func TestPostgresHandlerRoleStaysInTheRoute(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, schema := pgDB(t, driver, 1)
			var b [4]byte
			_, _ = rand.Read(b[:])
			role := "idem_nogrants_" + hex.EncodeToString(b[:])
			exec(t, db, "CREATE ROLE "+role+" NOLOGIN", "GRANT USAGE ON SCHEMA "+schema+" TO "+role,
				"CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, symbol TEXT NOT NULL)",
				"GRANT INSERT ON orders TO "+role, "GRANT USAGE ON SEQUENCE orders_id_seq TO "+role)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = db.ExecContext(ctx, "DROP OWNED BY "+role)
				_, _ = db.ExecContext(ctx, "DROP ROLE "+role)
			})
			var login string
			if err := db.QueryRowContext(t.Context(), "SELECT current_user").Scan(&login); err != nil {
				t.Fatal(err)
			}
			s := pgStore(t, db)
			setRole := ""
			var users []string
			h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
				tx, _ := sqlstore.TxFromContext(r.Context())
				var user string
				if err := tx.QueryRowContext(r.Context(), "SELECT current_user").Scan(&user); err != nil {
					t.Errorf("current_user: %v", err)
				}
				users = append(users, user)
				if setRole != "" {
					if _, err := tx.ExecContext(r.Context(), setRole+" "+role); err != nil {
						t.Errorf("%s: %v", setRole, err)
					}
				}
				if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('AAPL')"); err != nil {
					t.Errorf("insert as %s: %v", role, err)
				}
				w.WriteHeader(http.StatusCreated)
			})
			for _, set := range []string{"SET LOCAL ROLE", "SET ROLE", ""} {
				setRole = set
				key := uuid.NewString()
				if code, body, _ := post(t, h, key, "x"); code != http.StatusCreated {
					t.Fatalf("order after %q: %d %s, want 201", set, code, body)
				}
				if code, _, hdr := post(t, h, key, "x"); code != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry after %q: %d, want the replay", set, code)
				}
			}
			if n := countRows(t, db, "orders"); n != 3 {
				t.Fatalf("%d orders, want 3", n)
			}
			for i, u := range users {
				if u != login {
					t.Fatalf("request %d ran as %q, want the pool's role %q (%v): a handler's role outlived its route", i, u, login, users)
				}
			}
		})
	}
}

// TestPostgresTableLockIsAnOutage: a transactional claim that waits on a
// table-level lock (LOCK TABLE ... ACCESS EXCLUSIVE held by another
// session: DDL, a migration) is a store error, 503 with Retry-After, not
// contention (409 in flight); the handler does not run (issue 33).
func TestPostgresTableLockIsAnOutage(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, schema := pgDB(t, driver, 3)
			s := pgStore(t, db)
			ran := 0
			h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
				ran++
				w.WriteHeader(http.StatusCreated)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			locker, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close()
			for _, q := range []string{"BEGIN", "LOCK TABLE " + schema + ".idempotency_keys IN ACCESS EXCLUSIVE MODE"} {
				if _, err := locker.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			code, body, hdr := post(t, h, uuid.NewString(), "x")
			if _, err := locker.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || ran != 0 {
				t.Fatalf("claim behind a table lock: %d %s (Retry-After %q), ran %d; want 503 with Retry-After, not run", code, body, hdr.Get("Retry-After"), ran)
			}
		})
	}
}

// TestPostgresHandlerEndsItsTransaction: a handler that runs ROLLBACK (or
// COMMIT) through ExecContext ended the transaction that holds the claim;
// PostgreSQL has no autocommit = 0, so a statement after it would run and
// commit on its own. The lent Tx reads the connection's transaction status
// after each call (pgx stdlib, lib/pq) and refuses every later call:
// nothing the handler runs after its ROLLBACK commits, and State reports
// TxEnded (issue 33, "no statement of the handler runs outside the
// transaction that holds the claim").
func TestPostgresHandlerEndsItsTransaction(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, _ := pgDB(t, driver, 2)
			exec(t, db, "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, symbol TEXT NOT NULL)")
			s := pgStore(t, db)
			for _, end := range []string{"ROLLBACK", "COMMIT"} {
				var after error
				h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
					tx, _ := sqlstore.TxFromContext(r.Context())
					if _, err := tx.ExecContext(r.Context(), end); err != nil {
						t.Errorf("%s: %v", end, err)
					}
					_, after = tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('AFTER')")
					w.WriteHeader(http.StatusCreated)
				})
				_, _, _ = post(t, h, uuid.NewString(), "x")
				if !errors.Is(after, sql.ErrTxDone) {
					t.Errorf("a statement after the handler's %s: %v, want refused (sql.ErrTxDone)", end, after)
				}
				if n := countRows(t, db, "orders"); n != 0 {
					t.Fatalf("after the handler's %s: %d orders committed, want 0: a statement ran outside the claim's transaction", end, n)
				}
			}
		})
	}
}

// TestPostgresDeadlockedTransferRunsOnce: TestMySQLDeadlockedTransferRunsOnce
// on PostgreSQL, both drivers. The handler is the deadlock's victim (the
// other session's deadlock_timeout is longer, so the handler's check finds
// the cycle): 40P01, class 40, transaction rollback. Its retried
// statements are refused, its 201 is never sent (503), and the retry of
// the same key executes once.
func TestPostgresDeadlockedTransferRunsOnce(t *testing.T) {
	t.Parallel()
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, _ := pgDB(t, driver, 4)
			exec(t, db, "CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL)", "INSERT INTO accounts VALUES (1, 1000), (2, 1000)")
			s := pgStore(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			other, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			for _, q := range []string{"SET deadlock_timeout = '10s'", "BEGIN", "UPDATE accounts SET balance = balance WHERE id = 2"} {
				if _, err := other.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			otherDone := make(chan error, 1)
			var runs, deadlocks atomic.Int32
			h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				tx, _ := sqlstore.TxFromContext(r.Context())
				transfer := func() error {
					if _, err := tx.ExecContext(r.Context(), "UPDATE accounts SET balance = balance - 10 WHERE id = 1"); err != nil {
						return err
					}
					if runs.Load() == 1 && deadlocks.Load() == 0 {
						go func() {
							_, err := other.ExecContext(ctx, "UPDATE accounts SET balance = balance WHERE id = 1")
							if err == nil {
								_, err = other.ExecContext(ctx, "ROLLBACK")
							}
							otherDone <- err
						}()
					}
					_, err := tx.ExecContext(r.Context(), "UPDATE accounts SET balance = balance + 10 WHERE id = 2")
					return err
				}
				err := transfer()
				if err != nil && strings.Contains(err.Error(), "40P01") {
					deadlocks.Add(1)
					_ = transfer() // the application's own retry of a deadlock
				}
				w.WriteHeader(http.StatusCreated)
			})
			key := uuid.NewString()
			code, body, hdr := post(t, h, key, "transfer")
			select {
			case err := <-otherDone:
				if err != nil {
					t.Fatalf("the other transaction: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("the other transaction never got account 1")
			}
			if deadlocks.Load() != 1 {
				t.Fatalf("the handler saw %d deadlocks, want 1", deadlocks.Load())
			}
			if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
				t.Fatalf("deadlocked transfer: %d %s (Retry-After %q), want 503 with Retry-After: 1", code, body, hdr.Get("Retry-After"))
			}
			if code, body, _ := post(t, h, key, "transfer"); code != http.StatusCreated {
				t.Fatalf("retry: %d %s, want 201", code, body)
			}
			var b1, b2 int
			if err := db.QueryRowContext(ctx, "SELECT (SELECT balance FROM accounts WHERE id = 1), (SELECT balance FROM accounts WHERE id = 2)").Scan(&b1, &b2); err != nil {
				t.Fatal(err)
			}
			if b1 != 990 || b2 != 1010 || runs.Load() != 2 {
				t.Fatalf("balances %d and %d after %d runs, want 990 and 1010 after 2", b1, b2, runs.Load())
			}
		})
	}
}
