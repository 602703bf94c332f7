package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/operator"
)

func init() {
	operator.Register(func(store any) (any, bool) {
		s, ok := store.(*Store)
		if !ok {
			return nil, false
		}
		return operator.Store[idempotency.Record, idempotency.Fence]{
			Lookup: s.lookup, ReleaseKey: s.releaseKey, Stats: s.stats, CountCleanup: s.countCleanup,
		}, true
	})
}

// Cleanup implements idempotency.Store: one batch of at most limit
// expired rows, never an in_flight row whose lease runs.
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

// scanListed reads a row of export, eraseKept or lookup, and extra, into
// rec: pgsql.Columns on PostgreSQL, COLS_ and won on MySQL.
func (s *Store) scanListed(row interface{ Scan(...any) error }, rec *idempotency.Record, extra ...any) error {
	if s.d.name == PostgreSQL {
		return scanColumns(row, rec, extra...)
	}
	return scanRecord(row, rec, nil, extra...)
}

// lookup is the operator's read of one key's rows (internal/operator).
func (s *Store) lookup(ctx context.Context, key, scope, endpoint string) ([]idempotency.Record, time.Time, error) {
	var (
		recs []idempotency.Record
		now  time.Time
	)
	err := s.withConn(ctx, func(c *sql.Conn) error {
		args := []any{key, scope, endpoint, endpoint}
		if s.d.name == PostgreSQL { // pgsql.LookupSQL: NULL for every endpoint
			args = []any{key, scope, sql.NullString{String: endpoint, Valid: endpoint != ""}}
		}
		rows, err := c.QueryContext(ctx, s.st.lookup, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rec idempotency.Record
			if err := s.scanListed(rows, &rec, dbTime{&now}); err != nil {
				return err
			}
			recs = append(recs, rec)
		}
		if err := rows.Err(); err != nil || !now.IsZero() {
			return err
		}
		return c.QueryRowContext(ctx, s.st.now).Scan(dbTime{&now})
	})
	if err != nil {
		return nil, time.Time{}, s.storeError("lookup", err)
	}
	return recs, now, nil
}

// releaseKey is the operator's release of one stuck key.
func (s *Store) releaseKey(ctx context.Context, f idempotency.Fence) (bool, error) {
	var n int64
	err := s.withConn(ctx, func(c *sql.Conn) error {
		r, err := c.ExecContext(ctx, s.st.releaseKey, s.fenceArgs(f)...)
		if err == nil {
			n, err = r.RowsAffected()
		}
		return err
	})
	if err != nil {
		return false, s.storeError("release", err)
	}
	return n == 1, nil
}

// stats counts the table in one read.
func (s *Store) stats(ctx context.Context) (operator.Stats, error) {
	var st operator.Stats
	var oldestInFlight, oldestExpired sql.NullFloat64 // NULL: none
	err := s.withConn(ctx, func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, s.st.stats).Scan(&st.Total, &st.InFlight, &st.Completed, &st.Failed,
			&oldestInFlight, &st.InFlightPastLease, &st.AwaitingCleanup, &oldestExpired)
	})
	if err != nil {
		return operator.Stats{}, s.storeError("stats", err)
	}
	st.OldestInFlightAge, st.OldestExpiredAge = s.statsAge(oldestInFlight.Float64), s.statsAge(oldestExpired.Float64)
	return st, nil
}

// statsAge is an age the stats statement computed: microseconds on MySQL,
// seconds on PostgreSQL.
func (s *Store) statsAge(v float64) time.Duration {
	if s.d.name == PostgreSQL {
		return time.Duration(v * float64(time.Second))
	}
	return time.Duration(v) * time.Microsecond
}

// countCleanup counts the rows Cleanup would delete now.
func (s *Store) countCleanup(ctx context.Context) (int64, error) {
	var n int64
	err := s.withConn(ctx, func(c *sql.Conn) error { return c.QueryRowContext(ctx, s.st.countCleanup).Scan(&n) })
	if err != nil {
		return 0, s.storeError("cleanup", err)
	}
	return n, nil
}

// cleanupOn deletes one batch on c.
func (s *Store) cleanupOn(ctx context.Context, c *sql.Conn, limit int) (int64, error) {
	r, err := c.ExecContext(ctx, s.st.cleanup, limit)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}
