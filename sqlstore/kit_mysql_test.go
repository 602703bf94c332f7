package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
)

// TestMySQLKit runs the whole conformance suite on MariaDB.
func TestMySQLKit(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
		return newMySQLDB(t).store(t, 16)
	})
}

// TestMySQLKitTx runs the transactional part on MariaDB, writing ledger
// rows through the route's *sql.Conn.
func TestMySQLKitTx(t *testing.T) {
	t.Parallel()
	dbs := map[*testing.T]*sql.DB{}
	idempotencytest.RunTx(t, func(t *testing.T) idempotency.TxStore {
		d := newMySQLDB(t)
		db := d.open(t, 16)
		exec(t, db, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(32)) ENGINE=InnoDB")
		s := d.store(t, 16)
		dbsMu.Lock()
		dbs[t] = db
		dbsMu.Unlock()
		return s
	}, func(ctx context.Context, tx any) error {
		_, err := tx.(*sql.Conn).ExecContext(ctx, "INSERT INTO ledger (note) VALUES ('x')")
		return err
	}, func(t *testing.T) int {
		dbsMu.Lock()
		db := dbs[t]
		dbsMu.Unlock()
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM ledger").Scan(&n); err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	})
}
