package idempotency

import (
	"context"
	"time"
)

// What an operator reads from the table (the CLI's inspect, stats and
// cleanup --dry-run): read-only statements, against the database's clock.

// KeyRows are the rows of one key in one user scope, as Lookup read them.
type KeyRows struct {
	Records []Record  // one per endpoint, ordered by endpoint; empty when the key is unknown
	Now     time.Time // the database's clock at the read, to judge the records' times by
}

// TableStats counts the rows of the table in one read; ages are measured
// against the database's clock.
type TableStats struct {
	Total, InFlight, Completed, Failed int64
	// OldestInFlightAge is how long ago the oldest in_flight row was
	// claimed (its locked_at); 0 when InFlight is 0.
	OldestInFlightAge time.Duration
	// InFlightPastLease counts in_flight rows whose lease is over (stale:
	// the outcome is unknown).
	InFlightPastLease int64
	// AwaitingCleanup counts the rows Cleanup would delete now.
	AwaitingCleanup int64
	// OldestExpiredAge is how long the oldest of them has been expired;
	// 0 when AwaitingCleanup is 0.
	OldestExpiredAge time.Duration
}

// Lookup reads the rows of key in scope, on every endpoint, or on endpoint
// alone when it is not "". Read-only; an unknown key is no error.
func (s *PostgresStore) Lookup(ctx context.Context, key, scope, endpoint string) (KeyRows, error) {
	var out KeyRows
	var ep *string
	if endpoint != "" {
		ep = &endpoint
	}
	err := retryConnLoss(ctx, func() error {
		out = KeyRows{}
		rows, err := s.pool.Query(ctx, pgLookupSQL, key, scope, ep)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rec Record
			if err := scanRecord(rows, &rec, &out.Now); err != nil {
				return err
			}
			out.Records = append(out.Records, rec)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out.Records) == 0 {
			return s.pool.QueryRow(ctx, pgNowSQL).Scan(&out.Now)
		}
		return nil
	})
	if err != nil {
		return KeyRows{}, pgStoreError("lookup", err)
	}
	return out, nil
}

// Stats counts the table's rows in one scan (pgStatsSQL).
func (s *PostgresStore) Stats(ctx context.Context) (TableStats, error) {
	var st TableStats
	err := retryConnLoss(ctx, func() error {
		var inFlightAge, expiredAge *float64
		if err := s.pool.QueryRow(ctx, pgStatsSQL).Scan(&st.Total, &st.InFlight, &st.Completed, &st.Failed,
			&inFlightAge, &st.InFlightPastLease, &st.AwaitingCleanup, &expiredAge); err != nil {
			return err
		}
		st.OldestInFlightAge, st.OldestExpiredAge = seconds(inFlightAge), seconds(expiredAge)
		return nil
	})
	if err != nil {
		return TableStats{}, pgStoreError("stats", err)
	}
	return st, nil
}

// CountCleanup counts the rows Cleanup would delete now (pgCountCleanupSQL),
// reading only the expired end of the expiry index; it deletes nothing.
func (s *PostgresStore) CountCleanup(ctx context.Context) (int64, error) {
	var n int64
	err := retryConnLoss(ctx, func() error {
		return s.pool.QueryRow(ctx, pgCountCleanupSQL).Scan(&n)
	})
	if err != nil {
		return 0, pgStoreError("count cleanup", err)
	}
	return n, nil
}

// seconds converts a nullable count of seconds; NULL is 0.
func seconds(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}
