package sqlstore_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/migrations"
	"github.com/idemkit/idempotency/sqlstore"
)

// A transactional order route on MariaDB or MySQL: the claim, the order
// the handler writes through the lent *sqlstore.Tx and the key's record
// commit in one transaction. Compile-only: it needs a database.
func Example() {
	ctx := context.Background()
	dsn, err := sqlstore.MySQLDSN(os.Getenv("DATABASE_URL")) // mysql://user:pass@host:3306/db
	if err != nil {
		log.Fatal(err)
	}
	if err := migrations.MigrateMySQL(ctx, dsn); err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(ctx, db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Check(ctx); err != nil { // the table, its binary key columns, the grants
		log.Fatal(err)
	}
	mw, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		log.Fatal(err)
	}
	orders := mw.MustRoute(idempotency.RouteConfig{Transactional: true})
	http.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlstore.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (symbol) VALUES (?)", "AAPL"); err != nil {
			http.Error(w, `{"error":"write failed"}`, http.StatusInternalServerError) // rolls the writes back, the key failed
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
}
