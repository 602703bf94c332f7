package sqlstore

import (
	"database/sql"
	"reflect"
)

// pgIdle reports whether the PostgreSQL connection under c is outside any
// transaction, as the driver last heard from the server (its
// ReadyForQuery status; no round trip): a handler's COMMIT or ROLLBACK
// through ExecContext ended the route's transaction, and PostgreSQL has no
// autocommit = 0 to keep its next statement out of autocommit. It reads
// pgx stdlib's Conn().PgConn().TxStatus() and lib/pq's txnStatus by
// reflection (this package imports no driver); false for a driver it does
// not know.
func pgIdle(c *sql.Conn) bool {
	idle := false
	_ = c.Raw(func(dc any) error {
		status, ok := pgTxStatus(dc)
		idle = ok && status == 'I'
		return nil
	})
	return idle
}

// pgTxStatus returns the driver connection's transaction status: 'I'
// idle, 'T' in a transaction, 'E' in a failed one.
func pgTxStatus(dc any) (byte, bool) {
	v := reflect.ValueOf(dc)
	if m := v.MethodByName("Conn"); m.IsValid() && m.Type().NumIn() == 0 && m.Type().NumOut() == 1 { // pgx stdlib: *pgx.Conn
		if p := call(m.Call(nil)[0], "PgConn"); p.IsValid() {
			if s := call(p, "TxStatus"); s.IsValid() && s.Kind() == reflect.Uint8 {
				return byte(s.Uint()), true
			}
		}
		return 0, false
	}
	if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct { // lib/pq: *pq.conn
		if f := v.Elem().FieldByName("txnStatus"); f.IsValid() && f.Kind() == reflect.Uint8 {
			return byte(f.Uint()), true
		}
	}
	return 0, false
}

// call calls v's method name, which takes nothing and returns one value.
func call(v reflect.Value, name string) reflect.Value {
	if !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return reflect.Value{}
	}
	m := v.MethodByName(name)
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return reflect.Value{}
	}
	return m.Call(nil)[0]
}
