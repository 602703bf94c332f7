package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idempotency"
)

// Cleanup implements idempotency.Store: one batch of at most limit
// tombstones whose responses it purges, then one of at most limit rows past
// retain_until it deletes, never an in_flight row whose lease runs.
func (s *Store) Cleanup(ctx context.Context, limit int) (int64, error) {
	var n int64
	err := s.withConn(ctx, func(c *sql.Conn) error {
		var err error
		n, err = s.cleanupOn(ctx, c, limit)
		return err
	})
	if err != nil {
		return 0, s.storeError("cleanup", err)
	}
	return n, nil
}

// Erase implements idempotency.Store: in one transaction, at one instant
// of the server's clock, it deletes the scope's rows but the live
// in_flight ones, which it reads and reports.
func (s *Store) Erase(ctx context.Context, scope string) (idempotency.ErasureResult, error) {
	var res idempotency.ErasureResult
	err := s.withConn(ctx, func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		var now time.Time
		if err := tx.QueryRowContext(ctx, s.st.now).Scan(dbTime{&now}); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, s.st.eraseDelete, scope, now)
		if err != nil {
			return err
		}
		if res.Deleted, err = r.RowsAffected(); err != nil {
			return err
		}
		if res.Skipped, err = s.records(ctx, tx, s.st.eraseKept, scope, now); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return idempotency.ErasureResult{}, s.storeError("erase", err)
	}
	return res, nil
}

// ExportScope implements idempotency.Store.
func (s *Store) ExportScope(ctx context.Context, scope string) ([]idempotency.Record, error) {
	var recs []idempotency.Record
	err := s.withConn(ctx, func(c *sql.Conn) error {
		var err error
		recs, err = s.records(ctx, c, s.st.export, scope)
		return err
	})
	if err != nil {
		return nil, s.storeError("export", err)
	}
	return recs, nil
}

// records reads the rows a statement returns.
func (s *Store) records(ctx context.Context, x execer, stmt string, args ...any) ([]idempotency.Record, error) {
	rows, err := x.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []idempotency.Record
	for rows.Next() {
		var rec idempotency.Record
		if err := s.scanListed(rows, &rec); err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// scanListed reads a row of export or eraseKept, and extra, into
// rec: pgsql.Columns on PostgreSQL, COLS_ and won on MySQL.
func (s *Store) scanListed(row interface{ Scan(...any) error }, rec *idempotency.Record, extra ...any) error {
	if s.d.name == PostgreSQL {
		return scanColumns(row, rec, extra...)
	}
	return scanRecord(row, rec, nil, extra...)
}

// cleanupOn purges one batch and deletes one on c. On PostgreSQL both run
// in one transaction that plans them for the call (pgsql.CustomPlanSQL).
func (s *Store) cleanupOn(ctx context.Context, c *sql.Conn, limit int) (int64, error) {
	if s.st.cleanupPlans == "" {
		return s.cleanupWith(ctx, c, limit)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, s.st.cleanupPlans); err != nil {
		return 0, err
	}
	n, err := s.cleanupWith(ctx, tx, limit)
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// cleanupWith runs the purge, then the delete, on x.
func (s *Store) cleanupWith(ctx context.Context, x execer, limit int) (int64, error) {
	var total int64
	for _, stmt := range []string{s.st.purge, s.st.cleanup} {
		r, err := x.ExecContext(ctx, stmt, limit)
		if err != nil {
			return total, err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}
