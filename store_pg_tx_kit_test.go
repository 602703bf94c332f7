package idempotency_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresTxStore runs the transactional kit against the pgx store,
// writing ledger rows through the route's pgx.Tx.
func TestPostgresTxStore(t *testing.T) {
	t.Parallel()
	var pools sync.Map // *testing.T -> *pgxpool.Pool
	idempotencytest.RunTx(t, func(t *testing.T) idempotency.TxStore {
		pool := testdb.New(t)
		if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		pools.Store(t, pool)
		return idempotency.NewPostgresStore(pool)
	}, func(ctx context.Context, tx any) error {
		_, err := tx.(pgx.Tx).Exec(ctx, `INSERT INTO ledger DEFAULT VALUES`)
		return err
	}, func(t *testing.T) int {
		p, _ := pools.Load(t)
		var n int
		if err := p.(*pgxpool.Pool).QueryRow(t.Context(), `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	})
}
