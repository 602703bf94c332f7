package idemgorm_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gorm"
	"github.com/idemkit/idempotency/sqlstore"
)

// A transactional order route whose handler writes through GORM: the order
// row commits together with the key's record. GORM is opened on the
// store's *sql.DB; FromContext gives each request a session on the route's
// transaction.
func ExampleFromContext() {
	var sqlDB *sql.DB // sql.Open("mysql", dsn); the store and GORM share it
	store, err := sqlstore.New(context.Background(), sqlDB, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		panic(err)
	}
	db, err := gorm.Open(mysql.New(mysql.Config{Conn: sqlDB}), &gorm.Config{})
	if err != nil {
		panic(err)
	}
	idem, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		panic(err)
	}
	type Order struct {
		ID     int64
		Symbol string
	}
	orders := idem.MustRoute(idempotency.RouteConfig{Transactional: true})
	http.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemgorm.FromContext(r.Context(), db)
		o := Order{Symbol: r.FormValue("symbol")}
		if err := tx.Create(&o).Error; err != nil {
			http.Error(w, "order failed", http.StatusInternalServerError) // >= 500: rolled back, the key failed
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, o.ID)
	})))
}
