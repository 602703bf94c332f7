package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/idemkit/idempotency"
)

// newPostgres finishes New for the PostgreSQL dialect.
func newPostgres(ctx context.Context, s *Store, db *sql.DB, cfg Config, table string) (*Store, error) {
	return nil, errors.New("sqlstore: the PostgreSQL dialect is not built yet")
}

// pgInterval is d as an interval's text in milliseconds, rounded up, at
// least 1.
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Millisecond-1)/time.Millisecond), 1), 10) + "ms"
}

func (s *Store) pgInsertOn(ctx context.Context, x execer, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, errors.New("sqlstore: not built")
}

func (s *Store) pgCleanupOn(ctx context.Context, c *sql.Conn, limit int) (int64, error) {
	return 0, errors.New("sqlstore: not built")
}

func (s *Store) pgBound(ctx context.Context, tx *sql.Tx, lease time.Duration) error {
	return errors.New("sqlstore: not built")
}

func (t *routeTx) pgClaim(ctx context.Context, req idempotency.ClaimRequest, wait time.Duration) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, errors.New("sqlstore: not built")
}

func (t *routeTx) pgLockWait(ctx context.Context, wait time.Duration) error {
	return errors.New("not built")
}
func (t *routeTx) pgLockWaitRestore(ctx context.Context) error { return errors.New("not built") }
func (t *routeTx) pgAfterCommit() bool                         { return false }
