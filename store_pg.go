package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/probe"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The pgx store's face: PostgresStore, its Store methods (claim, settle,
// release, erase, export, cleanup).

// PostgresStore is a Store and TxStore on the PostgreSQL table
// idempotency_keys (see migrations), through a pgx pool. Processes sharing
// one database share its keys; every time comes from the database's now().
// It is safe for concurrent use.
type PostgresStore struct {
	pool      *pgPool    // qualifies the table in what it sends (store_pg_pool.go)
	probes    probe.Gate // one outage probe at a time (Probe)
	log       *slog.Logger
	listen    *listener                      // hears the wake-ups of waiting duplicates (wait_listen.go)
	listenCfg atomic.Pointer[pgx.ConnConfig] // ListenURL's; nil: the pool's
	batch     atomic.Pointer[batching]       // group commit (batch.go); nil: off
}

var (
	_ Store = (*PostgresStore)(nil)
)

// NewPostgresStore returns a PostgresStore on pool (the caller's to close).
// Size MaxConns for the transactional routes (a connection per handler) plus
// the other claims; set connect_timeout in the URL (it warns without one).
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore {
	// A black-holed network wedges a pool without a connect timeout for
	// minutes after it heals. A call that finds every connection in use fails
	// as ReasonPoolExhausted.
	return newPostgresStore(pool, slog.Default())
}

// ListenURL sets the wait listener's URL before use (a bad one: no change).
func (s *PostgresStore) ListenURL(url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("idempotency: ListenURL: %w", err)
	}
	s.listenCfg.Store(cfg)
	return nil
}

// watch wakes waiters by LISTEN on one connection outside the pool (watcher).
func (s *PostgresStore) watch(id int64) (<-chan struct{}, func()) { return s.listen.watch(id) }

// Close closes the wait listener's connection; the pool stays the caller's.
func (s *PostgresStore) Close() { s.listen.close() }

// errClaimVanished is the cause of a claim that kept reading no row.
var errClaimVanished = errors.New("the conflicting row was not visible after repeated attempts")

// claimAlone claims req's key by itself, in one round trip.
func (s *PostgresStore) claimAlone(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	// One statement (pgsql.ClaimSQL): the winner's insert and the loser's
	// read of the existing row.
	var last error
	lossRetried := false // see retryConnLoss
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		c, err := s.conn(ctx)
		if err == nil {
			var rows pgx.Rows
			if rows, err = c.Query(ctx, pgsql.ClaimSQL, claimArgs(req)...); err == nil {
				err = scanClaimRows(rows, req, &rec, &won)
			}
			c.release()
		}
		switch {
		case err == nil:
			return ClaimResult{Won: won, Record: rec}, nil
		case errors.Is(err, pgx.ErrNoRows):
			last = errClaimVanished
		case isRetryable(err):
			last = err
		case !lossRetried && isConnLoss(ctx, err):
			lossRetried, last = true, err
		default:
			return ClaimResult{}, pgStoreError("claim", err)
		}
		if err := ctx.Err(); err != nil {
			return ClaimResult{}, pgStoreError("claim", err)
		}
	}
	return ClaimResult{}, &StoreError{Op: "claim", Reason: ReasonConflict, Err: last}
}

// claimArgs are pgsql.ClaimSQL's parameters for req, in order.
func claimArgs(req ClaimRequest) []any {
	return []any{req.Key, req.Scope, req.Endpoint, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner), req.DeriveKeyID, req.Grace}
}

// Takeover implements Store with one fenced UPDATE.
func (s *PostgresStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return s.claimExisting(ctx, "takeover", pgsql.TakeoverSQL,
		f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner), f.Key, f.Endpoint, req.DeriveKeyID, req.Grace)
}

// claimExisting runs a fenced UPDATE ... RETURNING that makes the caller the
// new owner of an existing row; no row means another caller won.
func (s *PostgresStore) claimExisting(ctx context.Context, op, sql string, args ...any) (ClaimResult, error) {
	var rec Record
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			return scanRecord(c.QueryRow(ctx, sql, args...), &rec)
		})
	})
	switch {
	case err == nil:
		return ClaimResult{Won: true, Record: rec}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return ClaimResult{Lost: true}, nil
	default:
		return ClaimResult{}, pgStoreError(op, err)
	}
}

// Complete implements Store with one fenced UPDATE, alone or in a batch.
func (s *PostgresStore) Complete(ctx context.Context, f Fence, _ Record, resp Response) error {
	// Every body is stored and read back byte for byte: a BodyJSON body in
	// response_body, a BodyRaw body, empty included, in response_body_raw (a
	// sealed one too); BodyNone stores no body.
	jsonBody, rawBody, headers, err := completeArgs(resp)
	if err != nil {
		return err
	}
	r := record{f: f, code: resp.Status, body: jsonBody, raw: rawBody, hdrs: headers}
	if seal := resp.SealKeyID; seal != "" {
		r.seal = &seal
	}
	return s.complete(ctx, &r)
}

// Fail implements Store with one fenced UPDATE.
func (s *PostgresStore) Fail(ctx context.Context, f Fence) error {
	return pgOwnerError("fail", s.fenced(ctx, pgsql.FailSQL, f))
}

// Release implements Store with one fenced DELETE.
func (s *PostgresStore) Release(ctx context.Context, f Fence) error {
	return pgOwnerError("release", s.fenced(ctx, pgsql.ReleaseSQL, f))
}

// Renew implements Store with one fenced UPDATE.
func (s *PostgresStore) Renew(ctx context.Context, f Fence, req ClaimRequest) error {
	if req.Owner == uuid.Nil {
		return ErrNotOwner
	}
	c, err := s.conn(ctx)
	if err != nil {
		return pgStoreError("renew", err)
	}
	defer c.release()
	args := []any{f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint, req.Lease, ownerArg(req.Owner)}
	return pgOwnerError("renew", execFenced(ctx, c, pgsql.RenewSQL, args))
}

// fenced runs a statement whose five parameters are f (id, attempt,
// scope, key, endpoint), returning ErrNotOwner when it changed no row.
func (s *PostgresStore) fenced(ctx context.Context, sql string, f Fence) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.release()
	if err := execFenced(ctx, c, sql, []any{f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint}); err != nil {
		return err
	}
	s.wake(ctx, c, f)
	return nil
}

// execFenced runs a fenced statement whose parameters, the fence first,
// are args, on c (a concrete type: as an interface it would cost an
// allocation).
func execFenced(ctx context.Context, c pgConn, sql string, args []any) error {
	return retrySerialization(ctx, func() error {
		tag, err := c.Exec(ctx, sql, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotOwner
		}
		return nil
	})
}

// endLease implements reconcileStore.EndLease with one fenced UPDATE.
func (s *PostgresStore) endLease(ctx context.Context, f Fence) error {
	return pgOwnerError("end_lease", s.fenced(ctx, pgsql.EndLeaseSQL, f))
}

// claimStale implements reconcileStore.ClaimStale with one fenced UPDATE.
func (s *PostgresStore) claimStale(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return s.claimExisting(ctx, "reconcile", pgsql.ReconcileClaimSQL,
		f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint, req.Lease, ownerArg(req.Owner))
}

// stale implements reconcileStore.Stale with one SELECT.
func (s *PostgresStore) stale(ctx context.Context, endpoint string, limit int) ([]Record, error) {
	var recs []Record
	err := retryConnLoss(ctx, func() error {
		recs = nil
		return s.withConn(ctx, func(c pgConn) error {
			rows, err := c.Query(ctx, pgsql.StaleSQL, endpoint, int64(max(limit, 0)))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var rec Record
				if err := scanRecord(rows, &rec); err != nil {
					return err
				}
				recs = append(recs, rec)
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, pgStoreError("stale", err)
	}
	return recs, nil
}

// ReleaseOwner implements Store with one idempotent DELETE.
func (s *PostgresStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	// The DELETE names the key's scope (one shard on Citus); a lost
	// connection is retried once, like a claim.
	if req.Owner == uuid.Nil {
		return false, nil
	}
	var n int64
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			tag, err := c.Exec(ctx, pgsql.ReleaseOwnerSQL, req.Key, req.Scope, req.Endpoint, ownerArg(req.Owner))
			n = tag.RowsAffected()
			return err
		})
	})
	if err != nil {
		return false, pgStoreError("release", err)
	}
	return n > 0, nil
}

// sealKeyArg passes a seal key id, or NULL for a plaintext response.
func sealKeyArg(id string) any {
	if id == "" {
		return nil
	}
	return id
}

// ownerArg passes an owner token as its text form, or NULL for none. The
// statements cast it ($n::uuid), so it works in every pgx query mode.
func ownerArg(o uuid.UUID) any {
	if o == uuid.Nil {
		return nil
	}
	return o.String()
}

// Erase implements Store in one statement (one snapshot).
func (s *PostgresStore) Erase(ctx context.Context, scope string) (ErasureResult, error) {
	var res ErasureResult
	// REPEATABLE READ: a row that changed after the statement's snapshot
	// (a takeover committing while the DELETE waited for its
	// lock) fails the statement with a serialization error instead of
	// being skipped by the DELETE's re-check while the snapshot read still
	// sees it as deletable: every row is then deleted or reported, never
	// neither. The retry takes a new snapshot.
	err := retrySerialization(ctx, func() error {
		res = ErasureResult{}
		return s.withConn(ctx, func(c pgConn) error {
			return pgx.BeginTxFunc(ctx, c, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
				return eraseScope(ctx, tx, scope, &res)
			})
		})
	})
	if err != nil {
		return ErasureResult{}, pgStoreError("erase", err)
	}
	return res, nil
}

// eraseScope runs Erase's statement in tx, filling res.
func eraseScope(ctx context.Context, tx pgx.Tx, scope string, res *ErasureResult) error {
	rows, err := tx.Query(ctx, pgsql.DeleteScopeSQL, scope)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			deleted int64
			rec     nullRecord
		)
		if err := rows.Scan(append([]any{&deleted}, rec.dest()...)...); err != nil {
			return err
		}
		res.Deleted = deleted
		if r, ok, err := rec.record(); err != nil {
			return err
		} else if ok {
			res.Skipped = append(res.Skipped, r)
		}
	}
	return rows.Err()
}

// ExportScope implements Store with one SELECT.
func (s *PostgresStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	var recs []Record
	err := retryConnLoss(ctx, func() error {
		recs = nil
		c, err := s.conn(ctx)
		if err != nil {
			return err
		}
		defer c.release()
		rows, err := c.Query(ctx, pgsql.ExportScopeSQL, scope)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var rec Record
			if err := scanRecord(rows, &rec); err != nil {
				return err
			}
			recs = append(recs, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, pgStoreError("export", err)
	}
	return recs, nil
}

// Cleanup implements Store: a purge batch, then a delete batch.
func (s *PostgresStore) Cleanup(ctx context.Context, limit int) (int64, error) {
	// Each batch reads at most limit rows, earliest first, without locking
	// them (pgsql.PurgeBatchSQL: tombstones holding a response;
	// pgsql.ExpiredBatchSQL: rows past retain_until), then changes them
	// with one statement per scope (pgsql.PurgeScopeSQL,
	// pgsql.DeleteExpiredSQL). Each checks the predicate again, so a row
	// taken over since the read stays. Two cleaners running at once may read
	// the same rows: the second waits for the first's statement and then
	// changes none of them, so its batch may count fewer rows than it read
	// (the next batch or run goes on).
	if limit <= 0 {
		return 0, nil
	}
	var total int64
	for _, step := range [...][2]string{{pgsql.PurgeBatchSQL, pgsql.PurgeScopeSQL}, {pgsql.ExpiredBatchSQL, pgsql.DeleteExpiredSQL}} {
		var n int64
		err := retrySerialization(ctx, func() error {
			return s.withConn(ctx, func(c pgConn) (err error) {
				n, err = cleanupBatch(ctx, c, step[0], step[1], limit)
				return err
			})
		})
		if err != nil {
			return total, pgStoreError("cleanup", err)
		}
		total += n
	}
	return total, nil
}

// pgKeyEndpoint is a row's key within its scope.
type pgKeyEndpoint struct{ key, endpoint string }

// cleanupBatch runs one batch of Cleanup on c: the rows read reads, changed
// by change, one scope at a time.
func cleanupBatch(ctx context.Context, c pgConn, read, change string, limit int) (int64, error) {
	rows, err := c.Query(ctx, read, int64(limit))
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
		batch.Queue(change, sc, keys, endpoints)
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
