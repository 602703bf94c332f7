package idemgorm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"go.uber.org/goleak"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idempotency/contrib/gorm"
	"github.com/idemkit/idempotency/internal/ormtest"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/sqlstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// order is the orders table's model.
type order struct {
	ID     int64
	Symbol string
}

// openGorm opens GORM on b's pool, with b's dialect.
func openGorm(t *testing.T, b ormtest.Backend) *gorm.DB {
	t.Helper()
	var d gorm.Dialector
	switch b.Dialect {
	case sqlstore.MySQL:
		d = mysql.New(mysql.Config{Conn: b.DB})
	case sqlstore.PostgreSQL:
		d = postgres.New(postgres.Config{Conn: b.DB})
	default:
		t.Fatalf("no GORM dialector for %s", b.Dialect)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestGormRecipe: the handler creates its row through GORM on the lent
// transaction; a nested db.Transaction that fails rolls back to its
// savepoint only; db.Commit and db.Rollback are refused and the key stays
// owned; success commits one row and replays, a 500 rolls it back.
func TestGormRecipe(t *testing.T) {
	t.Parallel()
	for _, b := range ormtest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			db := openGorm(t, b)
			ormtest.Run(t, b, ormtest.Recipe{
				Write: func(r *http.Request, symbol string) error {
					g, ok := idemgorm.FromContext(r.Context(), db)
					if !ok {
						return errors.New("FromContext: no route transaction")
					}
					if err := g.Create(&order{Symbol: symbol}).Error; err != nil {
						return err
					}
					nestedErr := errors.New("nested fails")
					if err := g.Transaction(func(tx *gorm.DB) error {
						if err := tx.Create(&order{Symbol: "NESTED"}).Error; err != nil {
							return err
						}
						return nestedErr
					}); !errors.Is(err, nestedErr) {
						return fmt.Errorf("nested Transaction: %v, want its own error", err)
					}
					var mine, nested int64
					if err := g.Model(&order{}).Where("symbol = ?", symbol).Count(&mine).Error; err != nil {
						return err
					}
					if err := g.Model(&order{}).Where("symbol = ?", "NESTED").Count(&nested).Error; err != nil {
						return err
					}
					if mine != 1 || nested != 0 {
						return fmt.Errorf("after the nested rollback the transaction sees %d %s and %d NESTED orders, want 1 and 0", mine, symbol, nested)
					}
					return nil
				},
				EndTx: func(r *http.Request) (error, error) {
					g, _ := idemgorm.FromContext(r.Context(), db)
					return g.Commit().Error, g.Rollback().Error
				},
				Late: func(r *http.Request) error {
					g, _ := idemgorm.FromContext(r.Context(), db)
					var n int64
					return g.WithContext(context.Background()).Model(&order{}).Count(&n).Error
				},
			})
		})
	}
}

// TestFromContextOutsideARoute: outside a transactional route there is no
// session.
func TestFromContextOutsideARoute(t *testing.T) {
	if g, ok := idemgorm.FromContext(t.Context(), nil); ok || g != nil {
		t.Fatalf("FromContext outside a route: %v, %v; want nil, false", g, ok)
	}
}
