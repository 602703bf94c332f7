package idembun_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/bun"
	"github.com/idemkit/idempotency/sqlstore"
)

// A transactional order route whose handler inserts through Bun: the
// order row commits together with the key's record. Bun is opened on the
// store's *sql.DB; FromContext gives each request the route's transaction.
func ExampleFromContext() {
	var sqlDB *sql.DB // sql.Open("mysql", dsn); the store and Bun share it
	store, err := sqlstore.New(context.Background(), sqlDB, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		panic(err)
	}
	db := bun.NewDB(sqlDB, mysqldialect.New())
	idem, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		panic(err)
	}
	type Order struct {
		bun.BaseModel `bun:"table:orders"`
		ID            int64 `bun:",pk,autoincrement"`
		Symbol        string
	}
	orders := idem.MustRoute(idempotency.RouteConfig{Transactional: true})
	http.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idembun.FromContext(r.Context(), db)
		o := &Order{Symbol: r.FormValue("symbol")}
		if _, err := tx.NewInsert().Model(o).Exec(r.Context()); err != nil {
			http.Error(w, "order failed", http.StatusInternalServerError) // >= 500: rolled back, the key failed
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, o.ID)
	})))
}
