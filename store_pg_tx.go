package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
)

var _ TxStore = (*PostgresStore)(nil)

// Begin implements TxStore: a transaction on the store's pool, for a
// transactional route's handler.
func (s *PostgresStore) Begin(ctx context.Context) (RouteTx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, pgStoreError("begin", err)
	}
	return &pgRouteTx{tx: tx}, nil
}

// pgRouteTx is a PostgresStore's RouteTx.
type pgRouteTx struct {
	tx pgx.Tx
}

// Tx implements RouteTx.
func (t *pgRouteTx) Tx() pgx.Tx { return t.tx }

// State implements RouteTx from the transaction status the server reports
// after each statement (pgconn's TxStatus).
func (t *pgRouteTx) State() TxState {
	switch t.tx.Conn().PgConn().TxStatus() {
	case 'I': // no transaction open: the handler ended it with SQL
		return TxEnded
	case 'E': // a statement failed and the handler carried on
		return TxAborted
	}
	return TxOpen
}

// Commit implements RouteTx: the fenced UPDATE of pgCompleteSQL, then
// COMMIT.
func (t *pgRouteTx) Commit(ctx context.Context, s *Settlement) error {
	if s != nil {
		if err := completeIn(ctx, t.tx, s.Fence, s.Response); err != nil {
			return err
		}
	}
	if err := t.tx.Commit(ctx); err != nil {
		return pgStoreError("commit", err)
	}
	return nil
}

// Abort implements RouteTx.
func (t *pgRouteTx) Abort(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil {
		return pgStoreError("rollback", err)
	}
	return nil
}
