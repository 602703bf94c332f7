package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The CLI's own reads across scopes (inspect's search, list) are plain SQL
// run on either dialect: written for PostgreSQL with $N parameters, each
// used once and in order, and {now} for the database's clock.

var dollarParam = regexp.MustCompile(`\$[0-9]+`)

// dialectSQL returns q for d's dialect: on MySQL, ? parameters and
// UTC_TIMESTAMP(6) (the columns hold UTC); on PostgreSQL, now().
func (d *database) dialectSQL(q string) string {
	if d.sqlDB == nil {
		return strings.ReplaceAll(q, "{now}", "now()")
	}
	return dollarParam.ReplaceAllString(strings.ReplaceAll(q, "{now}", "UTC_TIMESTAMP(6)"), "?")
}

// query runs q (see dialectSQL) and calls each after scanning every row
// into dest.
func (d *database) query(ctx context.Context, q string, args []any, dest []any, each func() error) error {
	q = d.dialectSQL(q)
	if d.pool != nil {
		rows, err := d.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, dest, each)
		return err
	}
	rows, err := d.sqlDB.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if err := each(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// announceScan tells, on stderr, that a command reads every scope: on
// PostgreSQL a sequential scan of the table (no index leads with the key
// or the status), on MySQL a read of the key's unique index (byKey) or of
// the whole table.
func (c *cli) announceScan(d *database, what string, byKey bool) {
	how := "a sequential scan of " + table
	if d.sqlDB != nil && byKey {
		how = "a read of the unique key (idem_key, scope_user_id, scope_endpoint)"
	} else if d.sqlDB != nil {
		how = "a full scan of " + table
	}
	fmt.Fprintf(c.stderr, "no --user or --unscoped: %s (%s), bounded by --timeout %v\n", what, how, c.g.timeout)
}
