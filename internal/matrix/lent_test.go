//go:build matrix

package matrix

import (
	"context"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// The lent transaction's other calls, on pgx.Tx and *sqlstore.Tx alike.

// lentString runs a one-value query through the lent transaction.
func lentString(ctx context.Context, q string) (string, error) {
	var s string
	if tx, ok := idempotency.TxFromContext(ctx); ok {
		err := tx.QueryRow(ctx, q).Scan(&s)
		return s, err
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		err := tx.QueryRowContext(ctx, q).Scan(&s)
		return s, err
	}
	return "", errNoTx
}

// lentUnscanned runs a query and leaves its rows open: never read, never
// closed.
func lentUnscanned(ctx context.Context, q string) error {
	if tx, ok := idempotency.TxFromContext(ctx); ok {
		_, err := tx.Query(ctx, q)
		return err
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		_, err := tx.QueryContext(ctx, q) //nolint:rowserrcheck // the fault: rows left open
		return err
	}
	return errNoTx
}

// lentRowErr reads a row's error without a scan: QueryRowContext(...).Err()
// on database/sql; on pgx a QueryRow never scanned.
func lentRowErr(ctx context.Context, q string) error {
	if tx, ok := idempotency.TxFromContext(ctx); ok {
		_ = tx.QueryRow(ctx, q)
		return nil
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		return tx.QueryRowContext(ctx, q).Err()
	}
	return errNoTx
}
