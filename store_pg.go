package idempotency

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresStore is a Store on a PostgreSQL table, idempotency_keys (see
// Migrate), reached through a pgx connection pool. Several processes sharing
// one database share its keys, so at most one of them runs a handler per key.
// Every time it stores or compares comes from the database's now(), so the
// clocks of the application servers never matter.
//
// A PostgresStore is safe for concurrent use. It qualifies its table by the
// schema Check (else its first statement) found.
type PostgresStore struct {
	pool *pgPool // qualifies the table in what it sends (store_pg_table.go)
}

var (
	_ Store         = (*PostgresStore)(nil)
	_ OwnerReleaser = (*PostgresStore)(nil)
)

// NewPostgresStore returns a PostgresStore using pool. The pool stays the
// caller's: the store never closes it, and the caller closes it once the
// store and every middleware using it are done. Size the pool for the
// routes' concurrency; a call that cannot get a connection before its
// deadline fails as a timeout.
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore {
	return &PostgresStore{pool: &pgPool{Pool: pool}}
}

// errClaimVanished is the cause of a claim that kept reading no row.
var errClaimVanished = errors.New("the conflicting row was not visible after repeated attempts")

// Claim implements Store in one statement (pgClaimSQL): the winner's insert
// and the loser's read of the existing row take one round trip.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	var last error
	lossRetried := false // see retryConnLoss
	for range pgRetries {
		var (
			rec Record
			won bool
		)
		rows, err := s.pool.Query(ctx, pgClaimSQL, claimArgs(req)...)
		if err == nil {
			err = scanClaimRows(rows, req, &rec, &won)
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

// claimArgs are pgClaimSQL's parameters for req, in order.
func claimArgs(req ClaimRequest) []any {
	return []any{req.Key, req.Scope, req.Endpoint, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner)}
}

// Takeover implements Store with one fenced UPDATE.
func (s *PostgresStore) Takeover(ctx context.Context, f Fence, req ClaimRequest) (ClaimResult, error) {
	return s.claimExisting(ctx, "takeover", pgTakeoverSQL,
		f.ID, f.Attempt, f.Scope, req.RequestHash, req.TTL, req.Lease, ownerArg(req.Owner))
}

// claimExisting runs a fenced UPDATE ... RETURNING that makes the caller the
// new owner of an existing row; no row means another caller won.
func (s *PostgresStore) claimExisting(ctx context.Context, op, sql string, args ...any) (ClaimResult, error) {
	var rec Record
	err := retryConnLoss(ctx, func() error {
		return scanRecord(s.pool.QueryRow(ctx, sql, args...), &rec)
	})
	switch {
	case err == nil:
		return ClaimResult{Won: true, Record: rec}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return ClaimResult{}, nil
	default:
		return ClaimResult{}, pgStoreError(op, err)
	}
}

// Complete implements Store with one fenced UPDATE. A BodyJSON body goes to
// the JSONB column, and reads back as the same JSON value in Postgres's own
// text form (key order and white space normalised). A JSON body that JSONB
// cannot hold (a \u0000 escape, which JSONB refuses) is stored byte for byte
// in the raw column, with the jsonStoredRaw marker in the JSONB column, and
// reads back as the same BodyJSON bytes. A BodyRaw body, empty included, is
// stored byte for byte; BodyNone stores no body.
func (s *PostgresStore) Complete(ctx context.Context, f Fence, resp Response) error {
	jsonBody, rawBody, headers, err := completeArgs(resp, false)
	if err != nil {
		return err
	}
	args := []any{f.ID, f.Attempt, f.Scope, resp.Status, jsonbArg(jsonBody), rawBody, jsonbArg(headers)}
	err = execFenced(ctx, s.pool, pgCompleteSQL, args)
	if rawBody == nil && jsonBody != nil && err != nil && pgReason(err) == ReasonData {
		// Postgres refused a value (ReasonData): the body is JSON it will
		// not store as JSONB (\u0000, a character the database encoding
		// lacks, a number beyond numeric's range, a value past JSONB's
		// limits). The update changed nothing, so store the bytes raw.
		args[4], args[5] = jsonbArg(jsonStoredRaw), jsonBody
		err = execFenced(ctx, s.pool, pgCompleteSQL, args)
	}
	return pgOwnerError("complete", err)
}

// Fail implements Store with one fenced UPDATE.
func (s *PostgresStore) Fail(ctx context.Context, f Fence) error {
	return pgOwnerError("fail", fenced(ctx, s.pool, pgFailSQL, f))
}

// Release implements Store with one fenced DELETE.
func (s *PostgresStore) Release(ctx context.Context, f Fence) error {
	return pgOwnerError("release", fenced(ctx, s.pool, pgReleaseSQL, f))
}

// execer runs a statement (the pool).
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// fenced runs a statement on q whose first three parameters are f (id,
// attempt, scope), returning ErrNotOwner when it changed no row.
func fenced(ctx context.Context, q execer, sql string, f Fence) error {
	return execFenced(ctx, q, sql, []any{f.ID, f.Attempt, f.Scope})
}

// execFenced runs a fenced statement whose parameters, the fence first,
// are args.
func execFenced(ctx context.Context, q execer, sql string, args []any) error {
	return retrySerialization(ctx, func() error {
		tag, err := q.Exec(ctx, sql, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotOwner
		}
		return nil
	})
}

// Cleanup implements Store: it reads at most limit deletable rows,
// earliest expiry first, without locking them (pgExpiredBatchSQL), then
// deletes them with one DELETE per scope (pgDeleteExpiredSQL), all sent in
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
	err := retrySerialization(ctx, func() (err error) {
		n, err = s.cleanupBatch(ctx, limit)
		return err
	})
	if err != nil {
		return 0, pgStoreError("cleanup", err)
	}
	return n, nil
}

// cleanupBatch runs one batch of Cleanup.
func (s *PostgresStore) cleanupBatch(ctx context.Context, limit int) (int64, error) {
	rows, err := s.pool.Query(ctx, pgExpiredBatchSQL, int64(limit))
	if err != nil {
		return 0, err
	}
	byScope := make(map[string][]int64)
	var (
		scope string
		id    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &id}, func() error {
		byScope[scope] = append(byScope[scope], id)
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
		ids := byScope[sc]
		slices.Sort(ids)
		batch.Queue(pgDeleteExpiredSQL, sc, ids)
	}
	results := s.pool.SendBatch(ctx, batch)
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

// ReleaseOwner implements OwnerReleaser with one DELETE that names the
// key's scope (one shard on Citus). A lost connection is retried once, like
// a claim: the DELETE is idempotent.
func (s *PostgresStore) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	if req.Owner == uuid.Nil {
		return false, nil
	}
	var n int64
	err := retryConnLoss(ctx, func() error {
		tag, err := s.pool.Exec(ctx, pgReleaseOwnerSQL, req.Key, req.Scope, req.Endpoint, ownerArg(req.Owner))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, pgStoreError("release", err)
	}
	return n > 0, nil
}

// ownerArg passes an owner token as its text form, or NULL for none. The
// statements cast it ($n::uuid), so it works in every pgx query mode.
func ownerArg(o uuid.UUID) any {
	if o == uuid.Nil {
		return nil
	}
	return o.String()
}

// Erase implements Store in one statement: the rows it deletes and
// the live in_flight rows it skips are read from one snapshot.
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
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, pgDeleteScopeSQL, scope)
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
		})
	})
	if err != nil {
		return ErasureResult{}, pgStoreError("erase", err)
	}
	return res, nil
}

// ExportScope implements Store with one SELECT.
func (s *PostgresStore) ExportScope(ctx context.Context, scope string) ([]Record, error) {
	var recs []Record
	err := retryConnLoss(ctx, func() error {
		recs = nil
		rows, err := s.pool.Query(ctx, pgExportScopeSQL, scope)
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
