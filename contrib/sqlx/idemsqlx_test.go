package idemsqlx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/jmoiron/sqlx"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/contrib/sqlx"
	"github.com/idemkit/idempotency/internal/ormtest"
	"github.com/idemkit/idempotency/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// order is the orders table's row.
type order struct {
	ID     int64  `db:"id"`
	Symbol string `db:"symbol"`
}

// TestSqlxRecipe: the handler inserts its row with NamedExecContext on the
// lent transaction and reads it back there with GetContext, SelectContext
// and QueryRowxContext; Commit and Rollback on the Tx are refused and the
// key stays owned; success commits one row and replays, a 500 rolls it
// back.
func TestSqlxRecipe(t *testing.T) {
	t.Parallel()
	for _, b := range ormtest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			db := sqlx.NewDb(b.DB, b.DriverName) // not closed: b.DB is the test's
			ormtest.Run(t, b, ormtest.Recipe{
				Write: func(r *http.Request, symbol string) error {
					tx, ok := idemsqlx.FromContext(r.Context(), db)
					if !ok {
						return errors.New("FromContext: no route transaction")
					}
					if _, err := tx.NamedExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES (:symbol)", order{Symbol: symbol}); err != nil {
						return err
					}
					var got order
					if err := tx.GetContext(r.Context(), &got, tx.Rebind("SELECT id, symbol FROM orders WHERE symbol = ?"), symbol); err != nil {
						return fmt.Errorf("GetContext: %w", err)
					}
					var all []order
					if err := tx.SelectContext(r.Context(), &all, tx.Rebind("SELECT id, symbol FROM orders WHERE symbol = ?"), symbol); err != nil {
						return fmt.Errorf("SelectContext: %w", err)
					}
					var n int
					if err := tx.QueryRowxContext(r.Context(), tx.Rebind("SELECT COUNT(*) FROM orders WHERE symbol = ?"), symbol).Scan(&n); err != nil {
						return fmt.Errorf("QueryRowxContext: %w", err)
					}
					// A row read only for its error holds nothing open: the
					// record that follows still runs on the connection.
					if err := tx.QueryRowxContext(r.Context(), "SELECT 1").Err(); err != nil {
						return fmt.Errorf("QueryRowxContext(...).Err(): %w", err)
					}
					var s2 order
					if err := tx.QueryRowxContext(r.Context(), tx.Rebind("SELECT id, symbol FROM orders WHERE symbol = ?"), symbol).StructScan(&s2); err != nil || s2 != got {
						return fmt.Errorf("QueryRowxContext(...).StructScan: %+v %v, want %+v", s2, err, got)
					}
					if got.Symbol != symbol || got.ID == 0 || len(all) != 1 || n != 1 {
						return fmt.Errorf("the transaction reads %+v, %d rows, count %d; want the one %s order", got, len(all), n, symbol)
					}
					if err := tx.GetContext(r.Context(), &got, tx.Rebind("SELECT id, symbol FROM orders WHERE symbol = ?"), "NONE"); !errors.Is(err, sql.ErrNoRows) {
						return fmt.Errorf("GetContext of no row: %v, want sql.ErrNoRows", err)
					}
					return nil
				},
				EndTx: func(r *http.Request) (error, error) {
					tx, _ := idemsqlx.FromContext(r.Context(), db)
					return tx.Commit(), tx.Rollback()
				},
				// QueryRowxContext between the handler's return and the
				// commit: refused like every other method.
				Late: func(r *http.Request) error {
					tx, _ := idemsqlx.FromContext(r.Context(), db)
					var n int
					return tx.QueryRowxContext(context.Background(), "SELECT COUNT(*) FROM orders").Scan(&n)
				},
			})
		})
	}
}

// TestFromContextOutsideARoute: outside a transactional route there is no
// transaction.
func TestFromContextOutsideARoute(t *testing.T) {
	if tx, ok := idemsqlx.FromContext(t.Context(), nil); ok || tx != nil {
		t.Fatalf("FromContext outside a route: %v, %v; want nil, false", tx, ok)
	}
}
