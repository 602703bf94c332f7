// Package migrations holds the SQL migrations of the idempotency_keys table
// and applies them with golang-migrate.
//
// It is a package of its own so that a program that uses only the root
// package (the middleware and the memory store) never imports golang-migrate
// and its dependencies.
package migrations

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/pgmigrate"
)

// FS holds the SQL migrations that create the idempotency_keys table, as
// golang-migrate files at its root (000001_name.up.sql and .down.sql). It is
// for hosts that run their own migrator: point it at this file system (for
// golang-migrate, iofs.New(migrations.FS, ".")) and give it a history table
// of its own, or copy the files into the host's migrations. Hosts without a
// migrator call Migrate instead.
//
//go:embed *.sql
var FS embed.FS

// Migrate applies every migration in FS that is not yet applied, to
// the current schema of pool's connections (the first existing schema of
// their search_path), with golang-migrate. It records applied versions in
// its own history table, idempotency_schema_migrations, never the host's
// schema_migrations. Nothing to apply is success, so it is safe to call at
// every start-up, from several replicas at once: they serialise on
// golang-migrate's advisory lock, which is per database, schema and history
// table. The pool stays the caller's and is not closed; the connections
// Migrate borrows are closed rather than returned, so no lock stays behind.
//
// ctx bounds it all: the wait for another replica's lock ends when ctx
// ends; no statement runs or waits for a lock longer than the time ctx had
// left when Migrate began (lock_timeout and statement_timeout on the
// migration's session; a run of several statements can therefore end
// somewhat past the deadline, never without bound), so a migration waiting
// behind live traffic or a pg_dump never hangs start-up; and a statement
// running when ctx is cancelled is cancelled. A migration that fails so
// rolls back whole (each runs in one transaction) and the recorded version
// stays where it was, not dirty; the next call tries again.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	m, err := pgmigrate.New(ctx, pool, FS)
	if err != nil {
		return fmt.Errorf("idempotency: migrate: %w", err)
	}
	defer func() {
		if cerr := m.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("idempotency: migrate: close: %w", cerr)
		}
	}()
	if err := m.Up(ctx); err != nil {
		return fmt.Errorf("idempotency: migrate: %w", err)
	}
	return nil
}
