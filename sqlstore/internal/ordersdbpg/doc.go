// Package ordersdbpg is ordersdb for PostgreSQL: the code sqlc
// (database/sql mode, engine postgresql) generates from query.sql and
// schema.sql with sqlc.yaml, hand-written here exactly as sqlc v1.31.1
// generates it (CI does not run sqlc; `sqlc generate` in this directory
// reproduces it). Its DBTX is the same interface, which *sqlstore.Tx
// satisfies.
package ordersdbpg
