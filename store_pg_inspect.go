package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/internal/operator"
	"github.com/idemkit/idempotency/internal/pgsql"
)

// What an operator reads from the table (the CLI's inspect, stats and
// cleanup --dry-run) and the release of one stuck key: read-only
// statements, against the database's clock, and one fenced DELETE. The CLI
// reaches them through internal/operator, where the store registers them.

func init() {
	operator.Register(func(store any) (any, bool) {
		s, ok := store.(*PostgresStore)
		if !ok {
			return nil, false
		}
		return operator.Store[Record, Fence]{Lookup: s.lookup, ReleaseKey: s.releaseKey, Stats: s.stats, CountCleanup: s.countCleanup}, true
	})
}

// lookup reads the rows of key in scope, on every endpoint, or on endpoint
// alone when it is not "" (operator.Store.Lookup), and the database's time.
func (s *PostgresStore) lookup(ctx context.Context, key, scope, endpoint string) ([]Record, time.Time, error) {
	var out struct {
		Records []Record
		Now     time.Time
	}
	var ep *string
	if endpoint != "" {
		ep = &endpoint
	}
	err := retryConnLoss(ctx, func() error {
		out.Records, out.Now = nil, time.Time{}
		rows, err := s.pool.Query(ctx, pgsql.LookupSQL, key, scope, ep)
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
			return s.pool.QueryRow(ctx, pgsql.NowSQL).Scan(&out.Now)
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, pgStoreError("lookup", err)
	}
	return out.Records, out.Now, nil
}

// stats counts the table's rows in one scan (pgsql.StatsSQL).
func (s *PostgresStore) stats(ctx context.Context) (operator.Stats, error) {
	var st operator.Stats
	err := retryConnLoss(ctx, func() error {
		var inFlightAge, expiredAge *float64
		if err := s.pool.QueryRow(ctx, pgsql.StatsSQL).Scan(&st.Total, &st.InFlight, &st.Completed, &st.Failed,
			&inFlightAge, &st.InFlightPastLease, &st.AwaitingCleanup, &expiredAge); err != nil {
			return err
		}
		st.OldestInFlightAge, st.OldestExpiredAge = seconds(inFlightAge), seconds(expiredAge)
		return nil
	})
	if err != nil {
		return operator.Stats{}, pgStoreError("stats", err)
	}
	return st, nil
}

// countCleanup counts the rows Cleanup would delete now (pgsql.CountCleanupSQL),
// reading only the expired end of the expiry index; it deletes nothing.
func (s *PostgresStore) countCleanup(ctx context.Context) (int64, error) {
	var n int64
	err := retryConnLoss(ctx, func() error {
		return s.pool.QueryRow(ctx, pgsql.CountCleanupSQL).Scan(&n)
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
