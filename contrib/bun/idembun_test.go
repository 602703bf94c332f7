package idembun_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/schema"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/contrib/bun"
	"github.com/idemkit/idempotency/internal/ormtest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/sqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// order is the orders table's model.
type order struct {
	bun.BaseModel `bun:"table:orders"`
	ID            int64  `bun:"id,pk,autoincrement"`
	Symbol        string `bun:"symbol"`
}

// openBun opens Bun on b's pool, with b's dialect.
func openBun(t *testing.T, b ormtest.Backend) *bun.DB {
	t.Helper()
	var d schema.Dialect
	switch b.Dialect {
	case sqlstore.MySQL:
		d = mysqldialect.New()
	case sqlstore.PostgreSQL:
		d = pgdialect.New()
	default:
		t.Fatalf("no Bun dialect for %s", b.Dialect)
	}
	return bun.NewDB(b.DB, d) // not closed: b.DB is the test's, closed with it
}

// TestBunRecipe: the handler inserts its row through Bun on the lent
// transaction and reads it back there; Commit and Rollback on the Tx are
// refused and the key stays owned; success commits one row and replays, a
// 500 rolls it back.
func TestBunRecipe(t *testing.T) {
	t.Parallel()
	for _, b := range ormtest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			db := openBun(t, b)
			ormtest.Run(t, b, ormtest.Recipe{
				Write: func(r *http.Request, symbol string) error {
					tx, ok := idembun.FromContext(r.Context(), db)
					if !ok {
						return errors.New("FromContext: no route transaction")
					}
					o := &order{Symbol: symbol}
					if _, err := tx.NewInsert().Model(o).Exec(r.Context()); err != nil {
						return err
					}
					if o.ID == 0 {
						return errors.New("insert did not set the order's id")
					}
					var back order
					if err := tx.NewSelect().Model(&back).Where("id = ?", o.ID).Scan(r.Context()); err != nil {
						return fmt.Errorf("read the order back in the transaction: %w", err)
					}
					if back.Symbol != symbol {
						return fmt.Errorf("read back %q, want %q", back.Symbol, symbol)
					}
					return nil
				},
				EndTx: func(r *http.Request) (error, error) {
					tx, _ := idembun.FromContext(r.Context(), db)
					return tx.Commit(), tx.Rollback()
				},
				Late: func(r *http.Request) error {
					tx, _ := idembun.FromContext(r.Context(), db)
					var back order
					return tx.NewSelect().Model(&back).Limit(1).Scan(context.Background())
				},
			})
		})
	}
}

// TestFromContextOutsideARoute: outside a transactional route there is no
// transaction.
func TestFromContextOutsideARoute(t *testing.T) {
	if _, ok := idembun.FromContext(t.Context(), nil); ok {
		t.Fatal("FromContext outside a route reported a transaction")
	}
}
