package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/idemkit/idempotency/internal/pgmigrate"
	"github.com/idemkit/idempotency/migrations"
)

func migrateHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency migrate up|down|version [flags]

Applies the migrations embedded in the library (the idempotency_keys table) to
the schema of the URL's connections (its search_path), recording them in
`+pgmigrate.HistoryTable+` (never the application's own schema_migrations).
With a mysql:// URL it applies the MySQL/MariaDB migrations (sqlstore's MySQL
dialect) to the URL's database, recorded in the table of the same name.

  up       apply every migration not yet applied; nothing to apply is success,
           so it is safe to run at every deploy and from several hosts at once
  down     roll every migration back: DROPS idempotency_keys and every stored
           key. Refused (exit 2) without --yes
  version  print the applied version (the latest is `+latestVersion(migrations.FS)+` on PostgreSQL, `+latestVersion(migrations.MySQLFS)+` on
           MySQL/MariaDB), or "none"

Example:
  idempotency migrate up --database-url postgres://app@db:5432/app
`)
}

// latestVersion is the version of the last migration in fsys, as
// golang-migrate reads their names ("?" if it cannot: the help still
// prints).
func latestVersion(fsys fs.FS) string {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return "?"
	}
	defer func() { _ = src.Close() }()
	v, err := src.First()
	if err != nil {
		return "?"
	}
	for {
		next, err := src.Next(v)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Sprint(v)
		}
		if err != nil {
			return "?"
		}
		v = next
	}
}

func runMigrate(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("migrate")
	yes := flags.Bool("yes", false, "confirm migrate down, which drops the table and every stored key")
	pos, err := c.parse(flags, args, migrateHelp)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing action: up, down or version (see idempotency migrate --help)")
	}
	action := pos[0]
	if err := noArgs("migrate", pos[1:]); err != nil {
		return err
	}
	switch action {
	case "up", "version":
	case "down":
		if !*yes {
			return usagef("down drops the %s table and every stored key: pass --yes to confirm", table)
		}
	default:
		return usagef("unknown action %q: want up, down or version", action)
	}

	url, err := c.databaseURL()
	if err != nil {
		return err
	}
	if isMySQLURL(url) {
		return c.migrateMySQL(ctx, action, url)
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	mctx, cancel := c.statementContext(ctx)
	defer cancel()
	m, err := pgmigrate.New(mctx, pool, migrations.FS)
	if err != nil {
		return c.dbError(ctx, "open migrations", err)
	}
	defer m.Close()

	before, dirty, err := version(mctx, m)
	if err != nil {
		return c.dbError(ctx, "read the migration version", err)
	}
	if action == "version" {
		return c.printVersion(before, dirty)
	}

	err = m.Run(mctx, func(mg *migrate.Migrate) error { return pgmigrate.Stepwise(mg, action == "up") })
	changed := !errors.Is(err, migrate.ErrNoChange)
	if err != nil && changed {
		return c.dbError(ctx, "migrate "+action, err)
	}
	after, _, err := version(mctx, m)
	if err != nil {
		return c.dbError(ctx, "read the migration version", err)
	}
	return c.printMigrated(action, changed, before, after)
}

// printVersion prints migrate version's answer.
func (c *cli) printVersion(v *uint, dirty bool) error {
	if c.g.json {
		return c.writeJSON(versionJSON{Version: v, Dirty: dirty})
	}
	line := versionText(v)
	if dirty {
		line += " (dirty: a migration failed half-way; repair the schema by hand)"
	}
	_, err := fmt.Fprintln(c.stdout, line)
	return err
}

// printMigrated prints what migrate up or down did.
func (c *cli) printMigrated(action string, changed bool, before, after *uint) error {
	if c.g.json {
		return c.writeJSON(struct {
			Action  string `json:"action"`
			Changed bool   `json:"changed"`
			From    *uint  `json:"from"`
			To      *uint  `json:"to"`
		}{action, changed, before, after})
	}
	var line string
	switch {
	case action == "up" && !changed:
		line = fmt.Sprintf("already at version %s: nothing to apply", versionText(after))
	case action == "up":
		line = fmt.Sprintf("migrated up: version %s -> %s", versionText(before), versionText(after))
	case !changed:
		line = "nothing to roll back: no migration applied"
	default:
		line = fmt.Sprintf("migrated down: version %s -> %s (%s dropped)", versionText(before), versionText(after), table)
	}
	_, err := fmt.Fprintln(c.stdout, line)
	return err
}

type versionJSON struct {
	Version *uint `json:"version"` // null when no migration is applied
	Dirty   bool  `json:"dirty"`
}

// version returns the applied version, nil when none.
func version(ctx context.Context, m *pgmigrate.Migrator) (*uint, bool, error) {
	var (
		v     uint
		dirty bool
	)
	err := m.Run(ctx, func(mg *migrate.Migrate) error {
		var err error
		v, dirty, err = mg.Version()
		return err
	})
	if errors.Is(err, migrate.ErrNilVersion) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return &v, dirty, nil
}

func versionText(v *uint) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprint(*v)
}
