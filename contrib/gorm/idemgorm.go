// Package idemgorm is the GORM recipe of the idempotency library's
// database/sql store (sqlstore): a transactional route's handler writes
// through GORM on the route's transaction, so its rows commit together
// with the key's completed record, or not at all.
//
// FromContext gives the handler a GORM session whose ConnPool is the
// route's *sqlstore.Tx. GORM treats it as an open transaction it did not
// begin: Create, Save, Update and Delete run on it without a transaction
// of their own, db.Transaction nests as a savepoint (an error returned
// from it rolls back to the savepoint only), and db.Commit and db.Rollback
// fail with idempotency.ErrTxManaged and change nothing. Answer >= 500 to
// roll the handler's writes back; the key is then failed.
//
// The session is the handler's alone and ends with it: every call made
// after the handler returned is refused (sqlstore.Tx).
package idemgorm

import (
	"context"

	"gorm.io/gorm"

	"github.com/idemkit/idempotency/sqlstore"
)

// FromContext returns a GORM session on the transaction that a
// transactional route of a sqlstore.Store lent to ctx's handler, with db's
// configuration and dialector (open db with the dialect of the store's
// database, for example gorm.io/driver/mysql on the store's *sql.DB) and
// ctx as its context. It reports false outside such a route.
func FromContext(ctx context.Context, db *gorm.DB) (*gorm.DB, bool) {
	tx, ok := sqlstore.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	s := db.Session(&gorm.Session{Context: ctx, NewDB: true}) // a Context clones the statement: db is untouched
	s.Statement.ConnPool = tx
	return s, true
}
