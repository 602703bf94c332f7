package sqlstore

import "reflect"

// pgRowLockWait reports a lock_timeout (55P03) that ran out on a row of
// the key: PostgreSQL reports such a wait with an error context naming
// the tuple ("while checking uniqueness of tuple ...", "while locking
// tuple ..."), in whatever language lc_messages says, and a wait on a lock
// of the table, its indexes or its sequence (DDL, LOCK TABLE, a
// migration) with none. Only whether there is a context counts, never its
// text: the pgx store's rule (isRowLockWait).
func pgRowLockWait(err error) bool {
	return hasCode(err, "55P03") && pgWhere(err) != ""
}

// pgWhere returns the error context of the PostgreSQL error inside err:
// the Where field of pgx's *pgconn.PgError and of lib/pq's *pq.Error, read
// by reflection (this package imports no driver).
func pgWhere(err error) string {
	where := ""
	walk(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return false
		}
		f := v.Elem().FieldByName("Where")
		if !f.IsValid() || f.Kind() != reflect.String {
			return false
		}
		where = f.String()
		return true
	})
	return where
}
