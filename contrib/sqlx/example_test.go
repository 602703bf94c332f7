package idemsqlx_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/sqlx"
	"github.com/idemkit/idempotency/sqlstore"
)

// A transactional order route whose handler inserts through sqlx: the
// order row commits together with the key's record. sqlx is opened on the
// store's *sql.DB; FromContext gives each request the route's transaction.
func ExampleFromContext() {
	var sqlDB *sql.DB // sql.Open("mysql", dsn); the store and sqlx share it
	store, err := sqlstore.New(context.Background(), sqlDB, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		panic(err)
	}
	db := sqlx.NewDb(sqlDB, "mysql")
	idem, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		panic(err)
	}
	type Order struct {
		Symbol string `db:"symbol"`
	}
	orders := idem.MustRoute(idempotency.RouteConfig{Transactional: true})
	http.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemsqlx.FromContext(r.Context(), db)
		res, err := tx.NamedExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES (:symbol)", Order{Symbol: r.FormValue("symbol")})
		if err != nil {
			http.Error(w, "order failed", http.StatusInternalServerError) // >= 500: rolled back, the key failed
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
}
