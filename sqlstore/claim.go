package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idempotency"
)

var _ idempotency.TxStore = (*Store)(nil)

// retries bounds how many times a claim runs again when the key's row
// vanished between the INSERT's conflict and the read (cleanup, a
// release), or the claim was chosen as a deadlock's victim (1213, 40001).
const retries = 5

// errClaimVanished is a claim that kept losing to a row that was gone by
// the time it read it.
var errClaimVanished = errors.New("sqlstore: the key's row kept vanishing between the claim and the read")

// execer is what runs the store's statements: a *sql.Conn or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// insertArgs are the MySQL insert statement's arguments for req
// (PostgreSQL's: pgClaimArgs).
func (s *Store) insertArgs(req idempotency.ClaimRequest) []any {
	return []any{req.Key, req.Scope, req.Endpoint, s.hashArg(req.RequestHash), mysqlMicros(req.Lease), mysqlMicros(req.TTL), s.ownerArg(req), req.DeriveKeyID,
		mysqlMicros(req.TTL + req.Grace)}
}

// Claim implements idempotency.Store: a plain INSERT of the in_flight row;
// on a duplicate key, a read of the existing row in a second statement
// (each statement its own transaction, so the read sees the committed
// row). A row gone by the time it is read, or a deadlock, runs the claim
// again, a bounded number of times.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := s.withConn(ctx, func(c *sql.Conn) error {
		var err error
		res, err = s.claimOn(ctx, c, req, "")
		return err
	})
	if err != nil { // res is f's: not read after a call left to finish on its own
		return idempotency.ClaimResult{}, s.storeError("claim", err)
	}
	return res, nil
}

// claimOn claims req on x; locking ("" or a locking clause) is appended
// to the loser's read inside a transaction.
func (s *Store) claimOn(ctx context.Context, x execer, req idempotency.ClaimRequest, locking string) (idempotency.ClaimResult, error) {
	last := errClaimVanished
	for range retries {
		res, err := s.insertOn(ctx, x, req)
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, errRetryClaim):
			last = errClaimVanished
		case hasCode(err, s.d.duplicate...):
			rec, won, found, err := s.readKeyOn(ctx, x, req, locking)
			if err != nil {
				return idempotency.ClaimResult{}, err
			}
			if found {
				return idempotency.ClaimResult{Won: won, Record: rec}, nil
			}
			last = errClaimVanished
		case hasCode(err, s.d.restart...):
			last = err
		default:
			return idempotency.ClaimResult{}, err
		}
		if err := ctx.Err(); err != nil {
			return idempotency.ClaimResult{}, err
		}
	}
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConflict, Err: last}
}

// insertOn inserts req's in_flight row and reads it back by id.
func (s *Store) insertOn(ctx context.Context, x execer, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if s.d.name == PostgreSQL {
		return s.pgInsertOn(ctx, x, req)
	}
	r, err := x.ExecContext(ctx, s.st.insert, s.insertArgs(req)...)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	id, err := r.LastInsertId()
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	var rec idempotency.Record
	if err := scanRecord(x.QueryRowContext(ctx, s.st.readID, id, req.Scope), &rec, nil); err != nil {
		return idempotency.ClaimResult{}, err
	}
	return idempotency.ClaimResult{Won: true, Record: rec}, nil
}

// readKeyOn reads req's row; found is false when there is none.
func (s *Store) readKeyOn(ctx context.Context, x execer, req idempotency.ClaimRequest, locking string) (rec idempotency.Record, won, found bool, err error) {
	if s.d.name == PostgreSQL { // pgsql.TxReadSQL: never won (ClaimSQL wins its own claim)
		err = scanClaim(x.QueryRowContext(ctx, s.st.readKey+locking, req.Key, req.Scope, req.Endpoint), req, &rec, &won)
	} else {
		err = scanRecord(x.QueryRowContext(ctx, s.st.readKey+locking, s.ownerArg(req), req.Key, req.Scope, req.Endpoint), &rec, &won)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return idempotency.Record{}, false, false, nil
	}
	return rec, won, err == nil, err
}

// Takeover implements idempotency.Store: the fenced UPDATE of an expired
// row and the read of the row it made, in one transaction.
func (s *Store) Takeover(ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := s.withConn(ctx, func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if res, err = s.takeoverOn(ctx, tx, f, req, ""); err != nil || !res.Won {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return idempotency.ClaimResult{}, s.storeError("takeover", err)
	}
	return res, nil
}

// takeoverOn runs the fenced takeover of f on x (bounded, a prefix for
// the statement) and reads the row back.
func (s *Store) takeoverOn(ctx context.Context, x execer, f idempotency.Fence, req idempotency.ClaimRequest, bounded string) (idempotency.ClaimResult, error) {
	var rec idempotency.Record
	if s.d.name == PostgreSQL { // UPDATE ... RETURNING: id is not indexed there
		args := []any{f.ID, f.Attempt, f.Scope, s.hashArg(req.RequestHash), pgInterval(req.TTL), pgInterval(req.Lease), s.ownerArg(req), f.Key, f.Endpoint, req.DeriveKeyID, pgGrace(req.Grace)}
		err := scanColumns(x.QueryRowContext(ctx, s.st.takeover, args...), &rec)
		if errors.Is(err, sql.ErrNoRows) {
			return idempotency.ClaimResult{Lost: true}, nil
		}
		return idempotency.ClaimResult{Won: err == nil, Record: rec}, err
	}
	args := append([]any{s.hashArg(req.RequestHash), mysqlMicros(req.Lease), mysqlMicros(req.TTL), s.ownerArg(req), req.DeriveKeyID, mysqlMicros(req.TTL + req.Grace)}, s.fenceArgs(f)...)
	r, err := x.ExecContext(ctx, bounded+s.st.takeover, args...)
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

// fenceArgs are a fenced statement's arguments: on MySQL the row's id,
// scope and attempt (its last arguments); on PostgreSQL pgsql's id,
// attempt, scope, key and endpoint (the primary key there; id is not
// indexed).
func (s *Store) fenceArgs(f idempotency.Fence) []any {
	if s.d.name == PostgreSQL {
		return []any{f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint}
	}
	return []any{f.ID, f.Scope, f.Attempt}
}

// recordArgs are the complete statement's arguments: the response's
// columns and the fence, in the dialect's order.
func (s *Store) recordArgs(f idempotency.Fence, status int, body, raw, headers, seal any) []any {
	if s.d.name == PostgreSQL { // pgsql.CompleteSQL
		return []any{f.ID, f.Attempt, f.Scope, status, pgBytes(body), raw, pgBytes(headers), seal, f.Key, f.Endpoint}
	}
	return append([]any{status, body, raw, headers, seal}, s.fenceArgs(f)...)
}

// hashArg is a request hash as bound: its hex (PostgreSQL decodes it to
// the 32 bytes it stores; MySQL stores the hex).
func (s *Store) hashArg(h string) any { return h }

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, f idempotency.Fence, _ idempotency.Record, resp idempotency.Response) error {
	body, raw, headers, seal, err := completeArgs(resp)
	if err != nil {
		return err
	}
	return s.fenced(ctx, "complete", s.st.complete, s.recordArgs(f, resp.Status, body, raw, headers, seal)...)
}

// Fail implements idempotency.Store.
func (s *Store) Fail(ctx context.Context, f idempotency.Fence) error {
	return s.fenced(ctx, "fail", s.st.fail, s.fenceArgs(f)...)
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, f idempotency.Fence) error {
	return s.fenced(ctx, "release", s.st.release, s.fenceArgs(f)...)
}

// Renew implements idempotency.Store.
func (s *Store) Renew(ctx context.Context, f idempotency.Fence, req idempotency.ClaimRequest) error {
	o := s.ownerArg(req)
	if o == nil {
		return idempotency.ErrNotOwner
	}
	if s.d.name == PostgreSQL { // pgsql.RenewSQL
		return s.fenced(ctx, "renew", s.st.renew, f.ID, f.Attempt, f.Scope, f.Key, f.Endpoint, pgInterval(req.Lease), o)
	}
	return s.fenced(ctx, "renew", s.st.renew, append(append([]any{mysqlMicros(req.Lease)}, s.fenceArgs(f)...), o)...)
}

// fenced runs one fenced statement; no row changed is ErrNotOwner.
func (s *Store) fenced(ctx context.Context, op, stmt string, args ...any) error {
	err := s.withConn(ctx, func(c *sql.Conn) error {
		for range retries {
			r, err := c.ExecContext(ctx, stmt, args...)
			if hasCode(err, s.d.restart...) {
				continue
			}
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			if err == nil && n != 1 {
				err = idempotency.ErrNotOwner
			}
			return err
		}
		return &idempotency.StoreError{Op: op, Reason: idempotency.ReasonConflict, Err: errors.New("deadlocks persisted past the retries")}
	})
	if errors.Is(err, idempotency.ErrNotOwner) {
		return err
	}
	return s.storeError(op, err)
}

// ReleaseOwner implements idempotency.Store.
func (s *Store) ReleaseOwner(ctx context.Context, req idempotency.ClaimRequest) (bool, error) {
	if req.Owner == ([16]byte{}) {
		return false, nil
	}
	var n int64
	err := s.withConn(ctx, func(c *sql.Conn) error {
		r, err := c.ExecContext(ctx, s.st.releaseOwner, req.Key, req.Scope, req.Endpoint, s.ownerArg(req))
		if err == nil {
			n, err = r.RowsAffected()
		}
		return err
	})
	if err != nil {
		return false, s.storeError("release", err)
	}
	return n == 1, nil
}
