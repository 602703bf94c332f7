package idempotency

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgNeededColumns are the columns the store reads or writes.
var pgNeededColumns = []string{
	"id", "idem_key", "scope_user_id", "scope_endpoint", "request_hash",
	"response_code", "response_body", "response_body_raw", "response_headers",
	"status", "attempt", "created_at", "locked_at", "locked_until", "expires_at", "owner_token", "seal_key_id",
}

// pgByteaColumns are the columns the store reads and writes as bytes: an
// older version of migration 000001 made the hash TEXT and the body and
// headers JSONB.
var pgByteaColumns = []string{"request_hash", "response_body", "response_body_raw", "response_headers"}

// ErrSchemaOutdated is returned, wrapped, by PostgresStore.Check for a
// table that lacks a column or constraint the store needs.
var ErrSchemaOutdated = errors.New("idempotency: the table's schema is outdated")

// Check verifies at start-up what every claim needs, so that a bad
// deployment fails to start rather than fail every claim: the
// idempotency_keys table the pool's search_path finds (none: a *StoreError
// of Reason ReasonSchema), its columns, their types where an older schema
// differs, and unique constraint
// (ErrSchemaOutdated, wrapped, naming what is missing: docs/stores.md "Upgrading an
// old version-1 database"), and the role's SELECT, INSERT, UPDATE and DELETE
// on it and USAGE on its id sequence, which a rolled-back probe transaction
// uses (a *StoreError of Reason ReasonPermission naming the privilege).
func (s *PostgresStore) Check(ctx context.Context) error {
	var (
		cols   []string
		bytea  []string
		unique bool
		table  string
	)
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			return c.poolConn.QueryRow(ctx, pgsql.CheckSQL, s.pool.table()).Scan(&cols, &unique, &bytea, &table)
		})
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
	for _, c := range pgByteaColumns {
		if slices.Contains(cols, c) && !slices.Contains(bytea, c) {
			missing = append(missing, "column "+c+" of type BYTEA")
		}
	}
	if !unique {
		missing = append(missing, "constraint uq_idem_key_user_endpoint UNIQUE (idem_key, scope_user_id, scope_endpoint)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the idempotency_keys table lacks %s: it was made by an older, unreleased version of migration 000001; "+
			"reset it as docs/stores.md \"Upgrading an old version-1 database\" says", ErrSchemaOutdated, strings.Join(missing, ", "))
	}
	return s.checkPrivileges(ctx)
}

// pgProbe is Check's privilege probe, in the order a claim and its record
// need them: each statement needs one privilege more than the ones before
// it. The row it writes is rolled back; the sequence value it takes is not
// (ids have gaps anyway).
//
// $1 key, $2 endpoint, after the first.
var pgProbe = []struct{ privilege, sql string }{
	{"USAGE on sequence idempotency_keys_id_seq", `SELECT nextval(pg_get_serial_sequence('idempotency_keys', 'id'))`},
	{"INSERT on table idempotency_keys", `INSERT INTO idempotency_keys
	(idem_key, scope_endpoint, request_hash, locked_until, expires_at) VALUES ($1, $2, '', now(), now())`},
	{"SELECT on table idempotency_keys", `SELECT id FROM idempotency_keys
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
	{"UPDATE on table idempotency_keys", `UPDATE idempotency_keys SET attempt = attempt + 1
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
	{"DELETE on table idempotency_keys", `DELETE FROM idempotency_keys
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
}

// checkPrivileges runs pgProbe, pipelined, in a transaction it rolls back.
func (s *PostgresStore) checkPrivileges(ctx context.Context) error {
	var failed int // the probe statement that failed
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			b := &pgx.Batch{}
			key := "idempotency-check-" + uuid.NewString()
			b.Queue(pgProbe[0].sql)
			for _, p := range pgProbe[1:] {
				b.Queue(p.sql, key, "idempotency Check probe")
			}
			br := tx.SendBatch(ctx, b)
			for failed = range pgProbe {
				if _, err := br.Exec(); err != nil {
					_ = br.Close()
					return err
				}
			}
			return br.Close()
		})
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return &StoreError{Op: "check", Reason: ReasonPermission, Err: fmt.Errorf(
			"the pool's role (user %q) lacks %s, which the store needs: GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys "+
				"and USAGE ON SEQUENCE idempotency_keys_id_seq to it: %w", s.pool.Config().ConnConfig.User, pgProbe[failed].privilege, err)}
	}
	if err != nil {
		return pgStoreError("check", err)
	}
	return nil
}
