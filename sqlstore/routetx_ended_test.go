package sqlstore_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/sqlstore"
)

// TestHandlerEndsTheRouteTransaction: a handler that writes, then ends the
// route's transaction itself with SQL and answers 201, gets 503 with
// Retry-After: 1, never its 201 (DESIGN-settled-r4 item 2). After its
// ROLLBACK nothing committed: the retry executes, once. After its COMMIT
// the claim and the write committed: the lease is ended (EndLease) and
// every retry answers 409 idempotency_outcome_unknown without running it.
// A write after the end is refused and never commits (on MariaDB it would
// begin a new transaction under autocommit = 0 that the record commits).
// On pgx stdlib, lib/pq and MariaDB.
func TestHandlerEndsTheRouteTransaction(t *testing.T) {
	t.Parallel()
	type backend struct {
		name         string
		s            *sqlstore.Store
		count, after func() int
	}
	var backends []backend
	for _, driver := range pgDrivers {
		db, _ := pgDB(t, driver, 2)
		exec(t, db, "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, symbol TEXT NOT NULL)")
		backends = append(backends, backend{driver, pgStore(t, db), func() int { return countRows(t, db, "orders WHERE symbol = 'X'") },
			func() int { return countRows(t, db, "orders WHERE symbol = 'AFTER'") }})
	}
	d := newMySQLDB(t)
	db := d.open(t, 2)
	exec(t, db, "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, symbol VARCHAR(16) NOT NULL) ENGINE=InnoDB")
	backends = append(backends, backend{"mysql", d.store(t, 2), func() int { return countRows(t, db, "orders WHERE symbol = 'X'") },
		func() int { return countRows(t, db, "orders WHERE symbol = 'AFTER'") }})

	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, end := range []string{"ROLLBACK", "COMMIT"} {
				var runs atomic.Int32
				h := orderRoute(t, b.s, func(w http.ResponseWriter, r *http.Request) {
					tx, _ := sqlstore.TxFromContext(r.Context())
					if runs.Add(1) == 1 {
						if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('X')"); err != nil {
							t.Errorf("insert: %v", err)
						}
						_, _ = tx.ExecContext(r.Context(), end)
						if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('AFTER')"); err == nil {
							t.Errorf("a write after the handler's %s: not refused", end)
						}
					} else if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES ('X')"); err != nil {
						t.Errorf("retry's insert: %v", err)
					}
					w.WriteHeader(http.StatusCreated)
				})
				before := b.count()
				key := uuid.NewString()
				if code, body, hdr := post(t, h, key, "x"); code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
					t.Fatalf("handler's %s then 201: %d %s (Retry-After %q), want 503 with Retry-After: 1", end, code, body, hdr.Get("Retry-After"))
				}
				code, body, _ := post(t, h, key, "x")
				if n := b.after(); n != 0 {
					t.Fatalf("after the handler's %s: %d writes it ran afterwards committed", end, n)
				}
				switch end {
				case "ROLLBACK":
					if code != http.StatusCreated || runs.Load() != 2 || b.count() != before+1 {
						t.Fatalf("retry after the handler's ROLLBACK: %d %s, runs %d, orders +%d; want 201, run twice, one order", code, body, runs.Load(), b.count()-before)
					}
				case "COMMIT":
					if code != http.StatusConflict || !strings.Contains(body, "idempotency_outcome_unknown") || runs.Load() != 1 || b.count() != before+1 {
						t.Fatalf("retry after the handler's COMMIT: %d %s, runs %d, orders +%d; want 409 outcome_unknown, run once, one order", code, body, runs.Load(), b.count()-before)
					}
				}
			}
		})
	}
}
