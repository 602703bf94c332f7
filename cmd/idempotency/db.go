package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
)

// connectTimeout bounds connecting to each address of the server, unless
// the URL sets connect_timeout itself.
const connectTimeout = 5 * time.Second

// table names the table in messages; every command reads it through the
// library (PostgresStore, migrations) or plain SQL (rows.go, list.go).
const table = "idempotency_keys"

// open resolves a PostgreSQL database URL, connects and checks that the server
// answers. A missing or malformed URL is a usage error. The caller closes
// the pool.
func (c *cli) open(ctx context.Context) (*pgxpool.Pool, error) {
	url, err := c.databaseURL()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("invalid database URL: %s", parseErrorDetail(err))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "idempotency-cli"
	}
	// One connection does the work; migrate borrows a second.
	cfg.MaxConns = 4
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	// The pool connects lazily: connect now, so an unreachable server is
	// one clear error. pgx applies the connect timeout per address; allow
	// two (IPv6 and IPv4 of one host name).
	pctx, cancel := context.WithTimeout(ctx, 2*cfg.ConnConfig.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, errors.New("interrupted while connecting")
		}
		return nil, fmt.Errorf("cannot reach the database: %s", connectDetail(err))
	}
	return pool, nil
}

// openChecked is open for the commands that read or change keys: it also
// checks that the table has what the library needs
// (PostgresStore.Check), so an old schema is one clear error.
func (c *cli) openChecked(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	if err := idempotency.NewPostgresStore(pool).Check(sctx); err != nil {
		pool.Close()
		if errors.Is(err, idempotency.ErrSchemaOutdated) {
			return nil, err
		}
		return nil, c.dbError(ctx, "check the table", err)
	}
	return pool, nil
}

// parseErrorDetail returns pgx's reason for refusing a URL without the URL
// itself, so no password reaches a terminal or a log.
func parseErrorDetail(err error) string {
	var pe *pgconn.ParseConfigError
	msg := err.Error()
	if errors.As(err, &pe) {
		if i := strings.LastIndex(msg, "`: "); strings.HasPrefix(msg, "cannot parse `") && i >= 0 {
			return msg[i+len("`: "):]
		}
		return "not a PostgreSQL URL or key=value connection string"
	}
	return msg
}

// connectDetail shortens a connection error.
func connectDetail(err error) string {
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return "timed out connecting: " + err.Error()
	}
	return err.Error()
}

// dbError turns a failed statement into the message an operator needs.
func (c *cli) dbError(ctx context.Context, what string, err error) error {
	var (
		se    *idempotency.StoreError
		pgErr *pgconn.PgError
	)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: interrupted", what)
	case isMissingTable(err) && c.mysql:
		return fmt.Errorf("table %s not found in the URL's database: run `idempotency migrate up`", table)
	case isMissingTable(err):
		return fmt.Errorf("table %s not found in the URL's schema (search_path): run `idempotency migrate up`", table)
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &se) && se.Reason == idempotency.ReasonTimeout):
		return fmt.Errorf("%s: timed out after %v (raise --timeout)", what, c.g.timeout)
	case errors.As(err, &se):
		return fmt.Errorf("%s failed (%s): %s", what, se.Reason, pgMessage(se.Err))
	case errors.As(err, &pgErr):
		return fmt.Errorf("%s failed: %s", what, pgMessage(err))
	}
	return fmt.Errorf("%s failed: %w", what, err)
}

// isMissingTable reports a missing table or column: the migrations have not
// been run (or the URL points at another schema).
func isMissingTable(err error) bool {
	var (
		se    *idempotency.StoreError
		pgErr *pgconn.PgError
	)
	if errors.As(err, &se) && se.Reason == idempotency.ReasonSchema {
		return true
	}
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01", "42703", "3F000": // undefined_table, undefined_column, invalid_schema_name
			return true
		}
	}
	return false
}

// pgMessage is a Postgres error's message and code (a MySQL error's
// message and number), else err's text.
func pgMessage(err error) string {
	if m, ok := mysqlMessage(err); ok {
		return m
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	return err.Error()
}
