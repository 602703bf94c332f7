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
