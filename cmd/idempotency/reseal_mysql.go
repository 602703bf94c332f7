package main

import (
	"context"
	"fmt"
)

// resealMySQLSelect is resealSelectSQL on MySQL: its primary key is the
// id, so the cursor is the id (an index range scan); {scope} is empty or
// the condition on one scope (its index holds the id too).
//
// $1 cursor id, $2 active key id, then the scope when there is one.
const resealMySQLSelect = `SELECT scope_user_id, id, attempt, idem_key, scope_endpoint, request_hash,
	response_code, response_body, response_body_raw, response_headers, seal_key_id
FROM idempotency_keys
WHERE id > ? AND status = 'completed' AND NOT (seal_key_id <=> ?)%s
ORDER BY id
LIMIT %d`

// resealMySQLUpdate is resealUpdateSQL on MySQL: fenced on the row's id,
// attempt, status and key id as read.
//
// Arguments: sealed value, active key id, id, attempt, key id read.
const resealMySQLUpdate = `UPDATE idempotency_keys SET
	response_body = NULL, response_headers = NULL, response_body_raw = ?, seal_key_id = ?
WHERE id = ? AND attempt = ? AND status = 'completed' AND seal_key_id <=> ?`

// mysqlSelect returns the statement and arguments of the next batch on
// MySQL.
func (r *resealer) mysqlSelect() (string, []any) {
	args := []any{r.id, r.n.ActiveKeyID}
	cond := ""
	if r.scoped {
		cond, args = " AND scope_user_id = ?", append(args, r.scope)
	}
	return fmt.Sprintf(resealMySQLSelect, cond, r.batch), args
}

// writeMySQL writes a batch's seals in one transaction, each fenced on its
// row as read.
func (r *resealer) writeMySQL(ctx context.Context, todo []*resealRow) error {
	tx, err := r.d.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var written int64
	for _, x := range todo {
		res, err := tx.ExecContext(ctx, resealMySQLUpdate, x.sealed, r.n.ActiveKeyID, x.row.ID, x.row.Attempt, x.keyID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		written += n
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	r.n.Resealed += written
	r.n.Changed += int64(len(todo)) - written
	return nil
}
