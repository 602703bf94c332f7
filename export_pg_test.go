package idempotency

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewPostgresStoreLoggingForTest is NewPostgresStore logging its
// construction warnings to log instead of slog.Default.
func NewPostgresStoreLoggingForTest(pool *pgxpool.Pool, log *slog.Logger) *PostgresStore {
	return newPostgresStore(pool, log)
}

// WaitersForTest is the number of duplicates waiting on s's wake-ups.
func WaitersForTest(s *PostgresStore) int { return s.listen.wakes.count() }

// ListenerForTest reports s's listener: the self-checks it passed and the
// connects that failed.
func ListenerForTest(s *PostgresStore) (heard, failed int64) {
	return s.listen.heard.Load(), s.listen.failed.Load()
}

// ShortListenCheckForTest bounds s's listener self-check by d.
func ShortListenCheckForTest(s *PostgresStore, d time.Duration) { s.listen.check = d }

// QueuedForTest is the number of claims and records queued for s's next
// rounds.
func QueuedForTest(s *PostgresStore) (claims, records int) {
	b := s.batch.Load()
	if b == nil {
		return 0, 0
	}
	b.gate.mu.Lock()
	defer b.gate.mu.Unlock()
	return len(b.gate.claims), len(b.gate.records)
}

// BatchingForTest reports s's group commit settings (0, 0: off).
func BatchingForTest(s *PostgresStore) (max, slots int) {
	if b := s.batch.Load(); b != nil {
		return b.max, b.slots
	}
	return 0, 0
}

// DistributedForTest is what Check does when it finds s's table
// distributed by Citus (or not).
func DistributedForTest(s *PostgresStore, yes bool) { s.distributed(yes) }
