package idempotency

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// pgCheckSQL reads, for the table $1 names (idempotency_keys as the
// connection's search_path finds it, or the store's resolved table), its
// columns, whether the unique constraint the claim's ON CONFLICT needs
// exists on exactly the key's three columns, and its schema-qualified name.
// No row: there is no such table.
const pgCheckSQL = `SELECT
	ARRAY(SELECT attname::text FROM pg_attribute
		WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
	EXISTS (SELECT 1 FROM pg_constraint k
		WHERE k.conrelid = c.oid AND k.contype IN ('u', 'p')
			AND ARRAY(SELECT a.attname::text FROM pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum = ANY(k.conkey) ORDER BY a.attname)
				= ARRAY['idem_key', 'scope_endpoint', 'scope_user_id']),
	format('%s.%I', c.relnamespace::regnamespace, c.relname)
FROM pg_class c
WHERE c.oid = to_regclass($1)`

// pgNeededColumns are the columns the store reads or writes.
var pgNeededColumns = []string{
	"id", "idem_key", "scope_user_id", "scope_endpoint", "request_hash",
	"response_code", "response_body", "response_body_raw", "response_headers",
	"status", "attempt", "created_at", "locked_at", "locked_until", "expires_at", "owner_token",
}

// ErrSchemaOutdated is returned (wrapped, naming what is missing) by
// PostgresStore.Check for a table that lacks a column or constraint the
// store needs.
var ErrSchemaOutdated = errors.New("idempotency: the table's schema is outdated")

// Check verifies that the idempotency_keys table the pool's search_path
// finds has every column and the unique constraint the store needs: no
// table is a *StoreError of Reason ReasonSchema, a table that lacks
// something is ErrSchemaOutdated, wrapped. Call
// it at start-up: a table made by an older version of the (unreleased,
// since edited) migration keeps version 1 in the migration history, so
// migrating does not fix it, and every claim against it would fail as a
// schema error, which a fail-open route answers by running the handler
// without deduplication. The error names what is missing; README
// ("Upgrading an old version-1 database") says how to reset the table.
func (s *PostgresStore) Check(ctx context.Context) error {
	var (
		cols   []string
		unique bool
		table  string
	)
	err := retryConnLoss(ctx, func() error {
		return s.pool.Pool.QueryRow(ctx, pgCheckSQL, s.pool.table()).Scan(&cols, &unique, &table)
	})
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return &StoreError{Op: "check", Reason: ReasonSchema,
				Err: errors.New("no idempotency_keys table in the search_path: run the migrations (migrations.Migrate, or idempotency migrate up)")}
		}
		return pgStoreError("check", err)
	}
	s.pool.resolve(table) // the store's table from now on (store_pg_table.go)
	var missing []string
	for _, c := range pgNeededColumns {
		if !slices.Contains(cols, c) {
			missing = append(missing, "column "+c)
		}
	}
	if !unique {
		missing = append(missing, "constraint uq_idem_key_user_endpoint UNIQUE (idem_key, scope_user_id, scope_endpoint)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the idempotency_keys table lacks %s: it was made by an older, unreleased version of migration 000001; "+
			"reset it as README \"Upgrading an old version-1 database\" says", ErrSchemaOutdated, strings.Join(missing, ", "))
	}
	return nil
}
