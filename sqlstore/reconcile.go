package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idempotency"
)

// The store's part of reconcile: ending a lease, the fenced reconcile
// claim of a stale row and the list of an endpoint's stale rows.

// EndLease is part of the reconcile extension a route with a Reconcile
// hook requires beyond idempotency.Store (docs/reconcile.md): f's in_flight
// row gets a lease that ends now, fenced as Fail is.
func (s *Store) EndLease(ctx context.Context, f idempotency.Fence) error {
	return s.fenced(ctx, "end_lease", s.st.endLease, s.fenceArgs(f)...)
}

// ClaimStale is part of the reconcile extension (EndLease): the fenced
// UPDATE of a stale row and the read of the row it made, in one
// transaction.
func (s *Store) ClaimStale(ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := s.withConn(ctx, func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if res, err = s.claimStaleOn(ctx, tx, f, req); err != nil || !res.Won {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return idempotency.ClaimResult{}, s.storeError("reconcile", err)
	}
	return res, nil
}

// claimStaleOn runs the reconcile claim of f on x and reads the row back.
func (s *Store) claimStaleOn(ctx context.Context, x execer, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var rec idempotency.Record
	if s.d.name == PostgreSQL {
		args := append(s.fenceArgs(f), pgInterval(req.Lease), s.ownerArg(req))
		err := scanColumns(x.QueryRowContext(ctx, s.st.reconcileClaim, args...), &rec)
		if errors.Is(err, sql.ErrNoRows) {
			return idempotency.ClaimResult{Lost: true}, nil
		}
		return idempotency.ClaimResult{Won: err == nil, Record: rec}, err
	}
	args := append([]any{mysqlMicros(req.Lease), s.ownerArg(req)}, s.fenceArgs(f)...)
	r, err := x.ExecContext(ctx, s.st.reconcileClaim, args...)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return idempotency.ClaimResult{Lost: err == nil}, err
	}
	if err := scanRecord(x.QueryRowContext(ctx, s.st.readID, f.ID, f.Scope), &rec, nil); err != nil {
		return idempotency.ClaimResult{}, err
	}
	return idempotency.ClaimResult{Won: true, Record: rec}, nil
}

// Stale is part of the reconcile extension (EndLease), in one SELECT.
func (s *Store) Stale(ctx context.Context, endpoint string, limit int) ([]idempotency.Record, error) {
	var recs []idempotency.Record
	err := s.withConn(ctx, func(c *sql.Conn) error {
		var err error
		recs, err = s.records(ctx, c, s.st.stale, endpoint, max(limit, 0))
		return err
	})
	if err != nil {
		return nil, s.storeError("stale", err)
	}
	return recs, nil
}
