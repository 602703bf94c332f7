package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
)

// neededColumns are the columns the store reads or writes.
var neededColumns = []string{
	"id", "idem_key", "scope_user_id", "scope_endpoint", "request_hash",
	"response_code", "response_body", "response_body_raw", "response_headers",
	"status", "attempt", "created_at", "locked_at", "locked_until", "expires_at", "owner_token", "seal_key_id",
	"derive_key_id", "retain_until", // migration 000002_round4
}

// keyColumns are the unique key's columns, sorted.
var keyColumns = []string{"idem_key", "scope_endpoint", "scope_user_id"}

// ErrNotBinary is returned, wrapped, by Check for a MySQL table whose key
// columns are not binary strings, or whose unique key is not a B-tree: a
// _ci collation merges keys and users that differ in case (AbC and abc,
// Alice and alice), utf8mb4_bin ignores trailing spaces on MariaDB, and a
// USING HASH unique key accepted duplicates at READ COMMITTED until
// MariaDB's MDEV-37199.
var ErrNotBinary = errors.New("sqlstore: the key columns are not binary strings under a B-tree unique key")

// Check verifies at start-up what every claim needs, so that a bad
// deployment fails to start rather than fail every claim: the table
// (missing: a *StoreError of Reason ReasonSchema), its columns
// (idempotency.ErrSchemaOutdated, wrapped, naming what is missing), on
// MySQL version 2 of its schema (response columns that are LONGBLOB under
// no CHECK, else idempotency.ErrSchemaOutdated naming migration
// 000002_round4) and binary key columns under a B-tree unique key
// (ErrNotBinary),
// and the privileges the store uses, by a probe transaction that inserts a
// row (taking the id from the sequence or AUTO_INCREMENT), updates, reads
// and deletes it, then rolls back (a *StoreError of Reason
// ReasonPermission).
func (s *Store) Check(ctx context.Context) error {
	if err := s.checkColumns(ctx); err != nil {
		return err
	}
	return s.probe(ctx)
}

// checkColumns reads the table's columns and unique keys from
// information_schema.
func (s *Store) checkColumns(ctx context.Context) error {
	schema, table := s.schemaTable()
	q := `SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = ? AND table_name = ?`
	if s.d.name == PostgreSQL {
		q = `SELECT column_name::text, data_type::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2`
	}
	types := map[string]string{}
	err := s.withConn(ctx, func(c *sql.Conn) error {
		rows, err := c.QueryContext(ctx, q, schema, table)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, typ string
			if err := rows.Scan(&name, &typ); err != nil {
				return err
			}
			types[strings.ToLower(name)] = strings.ToLower(typ)
		}
		return rows.Err()
	})
	if err != nil {
		return s.storeError("check", err)
	}
	if len(types) == 0 {
		return &idempotency.StoreError{Op: "check", Reason: idempotency.ReasonSchema,
			Err: fmt.Errorf("sqlstore: no table %s: run the migrations", s.table)}
	}
	need := neededColumns
	if s.d.name == PostgreSQL {
		need = append(slices.Clip(need), "purged") // migration 000002_round4: PostgreSQL's purge index keys on it
	}
	var missing []string
	for _, c := range need {
		if _, ok := types[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		if s.d.name == MySQL && slices.Contains(missing, "retain_until") { // round 4's column (#36): the migration adds it
			return fmt.Errorf("%w: %s lacks %s: %s", idempotency.ErrSchemaOutdated, s.table, strings.Join(missing, ", "), round4Fix)
		}
		return fmt.Errorf("%w: %s lacks %s: apply the migrations (idempotency migrate up; round 4's columns, such as derive_key_id, come with 000002_round4)",
			idempotency.ErrSchemaOutdated, s.table, strings.Join(missing, ", "))
	}
	if s.d.name == MySQL {
		if err := s.checkRollbackOnTimeout(ctx); err != nil {
			return err
		}
		if err := s.checkBytes(ctx, schema, table, types); err != nil {
			return err
		}
		return s.checkBinary(ctx, schema, table, types)
	}
	return nil
}

// bytesColumns hold a response on MySQL: LONGBLOB with no check, from
// migration 000002_round4 on. Migration 000001 made the JSON body and the
// headers text under JSON_VALID checks, which refuse bodies the engine
// records (JSON 32 levels deep on MariaDB, a lone surrogate escape).
var bytesColumns = []string{"response_body", "response_body_raw", "response_headers"}

// round4Fix says how to bring a table to version 2.
const round4Fix = "apply MySQL migration 000002_round4 (idempotency migrate up, or migrations.MigrateMySQL)"

// checkBytes refuses a table whose response columns are not LONGBLOB, or
// are under a CHECK: the table of a version-1 schema.
func (s *Store) checkBytes(ctx context.Context, schema, table string, types map[string]string) error {
	for _, c := range bytesColumns {
		if t := types[c]; t != "longblob" {
			return fmt.Errorf("%w: %s.%s is %s, not LONGBLOB: %s", idempotency.ErrSchemaOutdated, s.table, c, t, round4Fix)
		}
	}
	// MySQL 8.0's CHECK_CONSTRAINTS has no table name: the table's CHECKs
	// are read from TABLE_CONSTRAINTS, their clauses by name.
	var found []string
	err := s.withConn(ctx, func(c *sql.Conn) error {
		rows, err := c.QueryContext(ctx, `SELECT tc.constraint_name, cc.check_clause
FROM information_schema.table_constraints tc JOIN information_schema.check_constraints cc
	ON cc.constraint_schema = tc.constraint_schema AND cc.constraint_name = tc.constraint_name
WHERE tc.table_schema = ? AND tc.table_name = ? AND tc.constraint_type = 'CHECK'`, schema, table)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, clause string
			if err := rows.Scan(&name, &clause); err != nil {
				return err
			}
			if clause = strings.ToLower(clause); strings.Contains(clause, "response_body") || strings.Contains(clause, "response_headers") {
				found = append(found, name)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return s.storeError("check", err)
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: %s has CHECK %s on its response columns, which refuses bodies the engine records: drop it, as MySQL migration 000002_round4 does",
			idempotency.ErrSchemaOutdated, s.table, strings.Join(found, ", "))
	}
	return nil
}

// ErrRollbackOnTimeout is returned by Check on a MySQL/MariaDB server with
// innodb_rollback_on_timeout on: a lock wait that runs out would then roll
// back a transactional route's whole transaction, and the statements after
// it would run outside any transaction.
var ErrRollbackOnTimeout = errors.New("sqlstore: innodb_rollback_on_timeout is on; transactional routes need it off (the default)")

func (s *Store) checkRollbackOnTimeout(ctx context.Context) error {
	var on bool
	err := s.withConn(ctx, func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, `SELECT @@GLOBAL.innodb_rollback_on_timeout`).Scan(&on)
	})
	switch {
	case err != nil:
		return s.storeError("check", err)
	case on:
		return ErrRollbackOnTimeout
	}
	return nil
}

// checkBinary refuses key columns that are not binary strings, and a
// unique key on them that is not a B-tree.
func (s *Store) checkBinary(ctx context.Context, schema, table string, types map[string]string) error {
	for _, c := range keyColumns {
		if t := types[c]; t != "varbinary" && t != "binary" {
			return fmt.Errorf("%w: %s.%s is %s (want VARBINARY)", ErrNotBinary, s.table, c, t)
		}
	}
	found := false
	err := s.withConn(ctx, func(c *sql.Conn) error {
		rows, err := c.QueryContext(ctx, `SELECT index_name, index_type, GROUP_CONCAT(column_name ORDER BY column_name)
FROM information_schema.statistics WHERE table_schema = ? AND table_name = ? AND non_unique = 0
GROUP BY index_name, index_type`, schema, table)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, typ, cols string
			if err := rows.Scan(&name, &typ, &cols); err != nil {
				return err
			}
			if slices.Equal(strings.Split(strings.ToLower(cols), ","), keyColumns) {
				if !strings.EqualFold(typ, "BTREE") {
					return fmt.Errorf("%w: the unique key %s is %s", ErrNotBinary, name, typ)
				}
				found = true
			}
		}
		return rows.Err()
	})
	if err != nil {
		if errors.Is(err, ErrNotBinary) {
			return err
		}
		return s.storeError("check", err)
	}
	if !found {
		return fmt.Errorf("%w: %s has no unique key on (idem_key, scope_user_id, scope_endpoint)", idempotency.ErrSchemaOutdated, s.table)
	}
	return nil
}

// schemaTable returns the table's schema and name, unquoted.
func (s *Store) schemaTable() (string, string) {
	unq := func(p string) string {
		if len(p) >= 2 && (p[0] == '`' || p[0] == '"') {
			q := p[:1]
			return strings.ReplaceAll(p[1:len(p)-1], q+q, q)
		}
		return p
	}
	i := strings.LastIndex(s.table, ".")
	return unq(s.table[:i]), unq(s.table[i+1:])
}

// probe runs the privilege probe: a claim, its record, a read and a
// delete of a row of its own, rolled back.
func (s *Store) probe(ctx context.Context) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	req := idempotency.ClaimRequest{Key: "idempotency-check-" + hex.EncodeToString(b[:]), Scope: "", Endpoint: "idempotency Check probe",
		RequestHash: strings.Repeat("0", 64), TTL: time.Minute, Lease: time.Minute}
	err := s.withConn(ctx, func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		res, err := s.insertOn(ctx, tx, req)
		if err != nil {
			return fmt.Errorf("INSERT: %w", err)
		}
		f := res.Record.Fence()
		if _, err := tx.ExecContext(ctx, s.st.fail, s.fenceArgs(f)...); err != nil {
			return fmt.Errorf("UPDATE: %w", err)
		}
		if _, _, _, err := s.readKeyOn(ctx, tx, req, ""); err != nil {
			return fmt.Errorf("SELECT: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.st.release, s.fenceArgs(f)...); err != nil {
			return fmt.Errorf("DELETE: %w", err)
		}
		return nil
	})
	return s.storeError("check", err)
}
