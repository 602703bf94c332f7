package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

// mysqlFiles holds the MySQL/MariaDB migrations of the idempotency_keys
// table (the sqlstore package's MySQL dialect).
//
//go:embed mysql/*.sql
var mysqlFiles embed.FS

// MySQLFS holds the MySQL/MariaDB migrations of the idempotency_keys
// table for sqlstore's MySQL dialect (000001 creates it; 000002_round4
// makes the response columns LONGBLOB), as golang-migrate files at its
// root, for hosts that run their own migrator (as FS is for PostgreSQL).
// 000002_round4 holds several statements, run on one session: a
// golang-migrate host's connection needs multiStatements=true, as
// MigrateMySQL's has.
var MySQLFS fs.FS = mustSub(mysqlFiles, "mysql")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// MigrateMySQL applies every migration in MySQLFS that is not yet applied
// to the database dsn names (a go-sql-driver/mysql DSN, such as
// sqlstore.MySQLDSN returns), with golang-migrate's mysql driver, on a
// connection of its own opened with multiStatements=true (that connection
// only: the store's own must not have it). Applied versions go to its own
// history table, idempotency_schema_migrations. Nothing to apply is
// success, so it is safe at every start-up and from several replicas at
// once: they serialise on golang-migrate's GET_LOCK. ctx bounds the
// connection and each statement.
func MigrateMySQL(ctx context.Context, dsn string) (err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	cfg.MultiStatements = true
	cfg.ParseTime = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	driver, err := migratemysql.WithConnection(ctx, conn, &migratemysql.Config{
		MigrationsTable: mysqlHistoryTable,
		DatabaseName:    cfg.DBName,
	})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	src, err := iofs.New(MySQLFS, ".")
	if err != nil {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "mysql", driver)
	if err != nil {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	defer func() {
		if serr, derr := m.Close(); err == nil && (serr != nil || derr != nil) {
			err = fmt.Errorf("idempotency: migrate mysql: close: %w", errors.Join(serr, derr))
		}
	}()
	done := make(chan error, 1)
	go func() { done <- m.Up() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		m.GracefulStop <- true
		err = <-done
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("idempotency: migrate mysql: %w", err)
	}
	return nil
}

// mysqlHistoryTable is where MigrateMySQL records the applied version, as
// Migrate does on PostgreSQL.
const mysqlHistoryTable = "idempotency_schema_migrations"
