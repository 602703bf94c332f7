package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/ormtest"
	"github.com/idemkit/idempotency/sqlstore"
	"github.com/idemkit/idempotency/sqlstore/internal/ordersdb"
	"github.com/idemkit/idempotency/sqlstore/internal/ordersdbpg"
)

// The sqlc recipe (database/sql mode): sqlc's generated DBTX interface is
// satisfied by *sqlstore.Tx, so a transactional route's handler runs its
// generated queries on the route's transaction with New(tx). (Not
// WithTx, which takes a *sql.Tx: the middleware owns the transaction.) The
// order commits together with the key's record, or not at all.
func ExampleTxFromContext_sqlc() {
	var db *sql.DB // sql.Open("mysql", dsn), with go-sql-driver/mysql registered
	ctx := context.Background()
	store, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		panic(err)
	}
	orders := idem.MustRoute(idempotency.RouteConfig{Transactional: true})
	http.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlstore.TxFromContext(r.Context())
		id, err := ordersdb.New(tx).CreateOrder(r.Context(), r.FormValue("symbol"))
		if err != nil {
			http.Error(w, "order failed", http.StatusInternalServerError) // >= 500: rolled back, the key failed
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
}

// orderQueries are the generated queries of ordersdb (MySQL) and
// ordersdbpg (PostgreSQL): sqlc generates a package per engine.
type orderQueries interface {
	CreateOrder(ctx context.Context, symbol string) (int64, error)
	CountOrders(ctx context.Context, symbol string) (int64, error)
}

// sqlcQueries returns the dialect's generated queries on tx.
func sqlcQueries(d sqlstore.Dialect, tx *sqlstore.Tx) orderQueries {
	if d == sqlstore.PostgreSQL {
		return ordersdbpg.New(tx)
	}
	return ordersdb.New(tx)
}

// TestSqlcRecipe: sqlc-generated queries take the lent *sqlstore.Tx as
// their DBTX; the shared recipe checks (internal/ormtest) pass on it.
func TestSqlcRecipe(t *testing.T) {
	t.Parallel()
	for _, b := range ormtest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ormtest.Run(t, b, ormtest.Recipe{
				Write: func(r *http.Request, symbol string) error {
					tx, _ := sqlstore.TxFromContext(r.Context())
					q := sqlcQueries(b.Dialect, tx)
					if _, err := q.CreateOrder(r.Context(), symbol); err != nil {
						return err
					}
					if n, err := q.CountOrders(r.Context(), symbol); err != nil || n != 1 {
						return errors.Join(err, fmt.Errorf("the transaction sees %d %s orders after the insert, want 1", n, symbol))
					}
					return nil
				},
				EndTx: func(r *http.Request) (error, error) {
					tx, _ := sqlstore.TxFromContext(r.Context())
					return tx.Commit(), tx.Rollback()
				},
				Late: func(r *http.Request) error {
					tx, _ := sqlstore.TxFromContext(r.Context())
					_, err := sqlcQueries(b.Dialect, tx).CountOrders(context.Background(), "AAPL")
					return err
				},
			})
		})
	}
}
