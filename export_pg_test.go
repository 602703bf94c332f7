package idempotency

import (
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewPostgresStoreLoggingForTest is NewPostgresStore logging its
// construction warnings to log instead of slog.Default.
func NewPostgresStoreLoggingForTest(pool *pgxpool.Pool, log *slog.Logger) *PostgresStore {
	return newPostgresStore(pool, log)
}
