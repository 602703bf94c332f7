package idempotency

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// Cleanup implements Store: it reads at most limit deletable rows,
// earliest expiry first, without locking them (pgsql.ExpiredBatchSQL), then
// deletes them with one DELETE per scope (pgsql.DeleteExpiredSQL), all sent in
// one pipelined batch, which runs as one transaction. Each DELETE checks
// the predicate again, so a row taken over since the read stays. Two
// cleaners running at once may read the same rows: the second waits for
// the first's delete and then deletes none of them, so its batch may count
// fewer rows than it read (the next batch or run goes on).
func (s *PostgresStore) Cleanup(ctx context.Context, limit int) (int64, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := retrySerialization(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) (err error) {
			n, err = cleanupBatch(ctx, c, limit)
			return err
		})
	})
	if err != nil {
		return 0, pgStoreError("cleanup", err)
	}
	return n, nil
}

// pgKeyEndpoint is a row's key within its scope.
type pgKeyEndpoint struct{ key, endpoint string }

// cleanupBatch runs one batch of Cleanup on c.
func cleanupBatch(ctx context.Context, c pgConn, limit int) (int64, error) {
	rows, err := c.Query(ctx, pgsql.ExpiredBatchSQL, int64(limit))
	if err != nil {
		return 0, err
	}
	byScope := make(map[string][]pgKeyEndpoint)
	var scope string
	var k pgKeyEndpoint
	_, err = pgx.ForEachRow(rows, []any{&scope, &k.key, &k.endpoint}, func() error {
		byScope[scope] = append(byScope[scope], k)
		return nil
	})
	if err != nil || len(byScope) == 0 {
		return 0, err
	}
	// One order for every cleaner, so two of them lock rows in the same
	// order and do not deadlock.
	scopes := slices.Sorted(maps.Keys(byScope))
	batch := &pgx.Batch{}
	for _, sc := range scopes {
		rows := byScope[sc]
		slices.SortFunc(rows, func(a, b pgKeyEndpoint) int {
			return cmp.Or(strings.Compare(a.key, b.key), strings.Compare(a.endpoint, b.endpoint))
		})
		keys, endpoints := make([]string, len(rows)), make([]string, len(rows))
		for i, r := range rows {
			keys[i], endpoints[i] = r.key, r.endpoint
		}
		batch.Queue(pgsql.DeleteExpiredSQL, sc, keys, endpoints)
	}
	results := c.SendBatch(ctx, batch)
	var n int64
	for range scopes {
		tag, err := results.Exec()
		if err != nil {
			results.Close()
			return 0, err
		}
		n += tag.RowsAffected()
	}
	return n, results.Close()
}
