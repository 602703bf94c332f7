package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/idemkit/idempotency/migrations"
)

// mysqlHistoryTable is where the MySQL migrations' applied version is
// recorded, as migrations.MigrateMySQL records it.
const mysqlHistoryTable = "idempotency_schema_migrations"

// migrateMySQL is migrate on a MySQL/MariaDB URL: golang-migrate's mysql
// driver with migrations.MySQLFS, on a connection of its own opened with
// multiStatements=true (that connection only), under --timeout. Two
// migrators serialise on golang-migrate's GET_LOCK, which it waits for at
// most 10 s.
func (c *cli) migrateMySQL(ctx context.Context, action, url string) (err error) {
	db, err := c.openMySQL(ctx, url, true)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg, _ := mysqlConfig(url) // openMySQL parsed it
	mctx, cancel := c.statementContext(ctx)
	defer cancel()
	conn, err := db.Conn(mctx)
	if err != nil {
		return c.dbError(ctx, "open migrations", err)
	}
	driver, err := migratemysql.WithConnection(mctx, conn, &migratemysql.Config{
		MigrationsTable: mysqlHistoryTable,
		DatabaseName:    cfg.DBName,
	})
	if err != nil {
		_ = conn.Close()
		return c.dbError(ctx, "open migrations", err)
	}
	src, err := iofs.New(migrations.MySQLFS, ".")
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("read the migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "mysql", driver)
	if err != nil {
		_ = driver.Close()
		return c.dbError(ctx, "open migrations", err)
	}
	defer func() {
		if serr, derr := m.Close(); err == nil && (serr != nil || derr != nil) {
			err = fmt.Errorf("close migrations: %w", errors.Join(serr, derr))
		}
	}()

	before, dirty, err := mysqlVersion(m)
	if err != nil {
		return c.dbError(ctx, "read the migration version", err)
	}
	if action == "version" {
		return c.printVersion(before, dirty)
	}
	// golang-migrate takes no context: stop it gracefully (after the
	// migration under way) when --timeout or an interrupt ends mctx.
	done := make(chan error, 1)
	go func() {
		if action == "up" {
			done <- m.Up()
		} else {
			done <- m.Down()
		}
	}()
	select {
	case err = <-done:
	case <-mctx.Done():
		m.GracefulStop <- true
		err = errors.Join(<-done, mctx.Err())
	}
	changed := !errors.Is(err, migrate.ErrNoChange)
	if err != nil && changed {
		return c.dbError(ctx, "migrate "+action, err)
	}
	after, _, err := mysqlVersion(m)
	if err != nil {
		return c.dbError(ctx, "read the migration version", err)
	}
	return c.printMigrated(action, changed, before, after)
}

// mysqlVersion returns the applied version, nil when none.
func mysqlVersion(m *migrate.Migrate) (*uint, bool, error) {
	v, dirty, err := m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return &v, dirty, nil
}
