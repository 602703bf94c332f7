// Package sqlstore is an idempotency.Store on database/sql, for services
// whose data stack is database/sql (sqlc, sqlx), GORM or Bun, on MySQL or
// MariaDB, or on PostgreSQL through a database/sql driver. It implements
// idempotency.TxStore, so a transactional route claims the key, runs the
// handler's writes and records the response in one transaction: the handler
// writes through TxFromContext's *Tx.
//
// The package imports database/sql only; the program registers the driver
// (go-sql-driver/mysql for MySQL and MariaDB, pgx's stdlib or lib/pq for
// PostgreSQL) and opens the *sql.DB. The tables and their migrations are
// the migrations package's: MigrateMySQL for MySQL and MariaDB, Migrate (the
// pgx store's table, shared) for PostgreSQL. docs/sql.md says why each
// MySQL/MariaDB statement is as it is.
package sqlstore
