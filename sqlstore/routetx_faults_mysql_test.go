package sqlstore_test

import (
	"context"
	"database/sql"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/sqlstore"
)

// TestMySQLDeadlockedTransferRunsOnce: a transfer handler loses a real
// deadlock (1213) against a heavier transaction on another connection,
// catches the error and runs its statements again, then answers 201. InnoDB
// rolled its whole transaction back, the claim included, so nothing it ran
// after the deadlock may commit (autocommit = 0, and the lent Tx refuses
// every call after 1213), and the client gets 503, never the 201. The
// retry of the same key executes once: the balance is 990, not 980
// (issue 33, DESIGN-settled-r4 item 3).
func TestMySQLDeadlockedTransferRunsOnce(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	db := d.open(t, 4)
	exec(t, db,
		"CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO accounts VALUES (1, 1000), (2, 1000)",
		"CREATE TABLE heavy (id INT AUTO_INCREMENT PRIMARY KEY, n INT) ENGINE=InnoDB")
	s := d.store(t, 4)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The other transaction: heavier (200 rows written, so InnoDB picks the
	// handler's as the victim), holding account 2.
	other, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, q := range []string{"START TRANSACTION",
		"INSERT INTO heavy (n) SELECT seq FROM seq_1_to_200",
		"UPDATE accounts SET balance = balance WHERE id = 2"} {
		if _, err := other.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	otherDone := make(chan error, 1)

	var runs, deadlocks atomic.Int32
	h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, _ := sqlstore.TxFromContext(r.Context())
		var autocommit int
		if err := tx.QueryRowContext(r.Context(), "SELECT @@SESSION.autocommit").Scan(&autocommit); err != nil || autocommit != 0 {
			t.Errorf("the handler's session: autocommit %d (%v), want 0: a statement after the server ended the transaction would commit on its own", autocommit, err)
		}
		transfer := func() error {
			if _, err := tx.ExecContext(r.Context(), "UPDATE accounts SET balance = balance - 10 WHERE id = 1"); err != nil {
				return err
			}
			if runs.Load() == 1 {
				// Account 1 is held: the other transaction now waits on it.
				// Once the deadlock let it through, it rolls back, so that
				// the handler's retry is not left waiting on it.
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
		if err != nil && strings.Contains(err.Error(), "1213") {
			deadlocks.Add(1)
			err = transfer() // the application's own retry of a deadlock
		}
		_ = err // it answers 201 whatever the retry said
		w.WriteHeader(http.StatusCreated)
	})

	key := uuid.NewString()
	code, body, hdr := post(t, h, key, "transfer")
	select {
	case err := <-otherDone:
		if err != nil {
			t.Fatalf("the other transaction's update: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the other transaction never got account 1")
	}
	if deadlocks.Load() != 1 {
		t.Fatalf("the handler saw %d deadlocks, want 1 (the test did not set one up)", deadlocks.Load())
	}
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
		t.Fatalf("deadlocked transfer: %d %s (Retry-After %q), want 503 with Retry-After: 1, never the handler's 201", code, body, hdr.Get("Retry-After"))
	}
	if b1, b2 := balances(t, db); b1 != 1000 || b2 != 1000 {
		t.Fatalf("after the deadlock: balances %d and %d, want 1000 and 1000 (nothing the handler ran after it committed)", b1, b2)
	}
	if code, body, _ := post(t, h, key, "transfer"); code != http.StatusCreated {
		t.Fatalf("retry: %d %s, want 201", code, body)
	}
	if code, _, hdr := post(t, h, key, "transfer"); code != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second retry: %d, want the replay", code)
	}
	if b1, b2 := balances(t, db); b1 != 990 || b2 != 1010 {
		t.Fatalf("final balances %d and %d, want 990 and 1010: the transfer executed more than once", b1, b2)
	}
}

func balances(t *testing.T, db *sql.DB) (int, int) {
	t.Helper()
	var b1, b2 int
	if err := db.QueryRowContext(t.Context(), "SELECT (SELECT balance FROM accounts WHERE id = 1), (SELECT balance FROM accounts WHERE id = 2)").Scan(&b1, &b2); err != nil {
		t.Fatal(err)
	}
	return b1, b2
}

// TestRowErrWithoutScan (MySQL): a handler that checks
// QueryRowContext(...).Err() and never scans the row completes normally:
// 201 recorded, the retry replays, the handler ran once (issue 33: it got
// 503 on every retry and ran again each time).
func TestMySQLRowErrWithoutScan(t *testing.T) {
	t.Parallel()
	d := newMySQLDB(t)
	db := d.open(t, 2)
	exec(t, db, "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, symbol VARCHAR(16) NOT NULL) ENGINE=InnoDB")
	rowErrWithoutScan(t, d.store(t, 2), db, "INSERT INTO orders (symbol) VALUES ('AAPL')")
}

// rowErrWithoutScan runs TestRowErrWithoutScan's route on s; insert writes
// one row of orders.
func rowErrWithoutScan(t *testing.T, s *sqlstore.Store, db *sql.DB, insert string) {
	t.Helper()
	var runs atomic.Int32
	h := orderRoute(t, s, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, _ := sqlstore.TxFromContext(r.Context())
		if err := tx.QueryRowContext(r.Context(), "SELECT 1").Err(); err != nil {
			t.Errorf("QueryRowContext: %v", err)
		}
		if _, err := tx.ExecContext(r.Context(), insert); err != nil {
			t.Errorf("insert: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
	})
	key := uuid.NewString()
	for i := range 3 {
		code, body, hdr := post(t, h, key, "x")
		if code != http.StatusCreated || (i > 0) != (hdr.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("request %d: %d %s replayed %q, want 201 (replayed after the first)", i, code, body, hdr.Get("Idempotent-Replayed"))
		}
	}
	if runs.Load() != 1 || countRows(t, db, "orders") != 1 {
		t.Fatalf("handler ran %d times, %d orders; want 1 and 1", runs.Load(), countRows(t, db, "orders"))
	}
}
