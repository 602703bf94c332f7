// Package ordersdb is the code sqlc (database/sql mode, engine mysql)
// generates from query.sql and schema.sql with sqlc.yaml, for sqlstore's
// sqlc recipe. It is hand-written here exactly as sqlc v1.31.1 generates it
// (db.go, models.go, query.sql.go; CI does not run sqlc): `sqlc generate`
// in this directory reproduces it. The recipe's point is in db.go: the
// generated DBTX interface is satisfied by *sqlstore.Tx, so New(tx) runs
// the queries on a transactional route's transaction.
package ordersdb
