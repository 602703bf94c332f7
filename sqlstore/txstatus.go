package sqlstore

import (
	"database/sql"
	"reflect"
)

// txIdle reports whether the connection under c is outside any
// transaction, as the driver last heard from the server (no round trip):
// a handler's COMMIT or ROLLBACK through ExecContext, or on MySQL a
// statement that commits implicitly (DDL), ended the route's transaction.
// PostgreSQL has no autocommit = 0 to keep the handler's next statement
// out of autocommit, and on MySQL that statement would begin a new
// transaction the record then commits, so the lent Tx refuses it instead.
// It reads pgx stdlib's Conn().PgConn().TxStatus(), lib/pq's txnStatus and
// go-sql-driver's server status flags by reflection (this package imports
// no driver); false for a driver it does not know.
func txIdle(c *sql.Conn) bool {
	idle := false
	_ = c.Raw(func(dc any) error {
		idle = driverIdle(dc)
		return nil
	})
	return idle
}

// driverIdle reads a driver connection's transaction status (see txIdle).
func driverIdle(dc any) bool {
	v := reflect.ValueOf(dc)
	if m := v.MethodByName("Conn"); m.IsValid() && m.Type().NumIn() == 0 && m.Type().NumOut() == 1 { // pgx stdlib: *pgx.Conn
		if s := call(call(m.Call(nil)[0], "PgConn"), "TxStatus"); s.IsValid() && s.Kind() == reflect.Uint8 {
			return s.Uint() == 'I'
		}
		return false
	}
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	e := v.Elem()
	if f := e.FieldByName("txnStatus"); f.IsValid() && f.Kind() == reflect.Uint8 { // lib/pq: 'I', 'T' or 'E'
		return f.Uint() == 'I'
	}
	if e.Type().Name() == "mysqlConn" { // go-sql-driver: SERVER_STATUS_IN_TRANS of the last OK or EOF packet
		if f := e.FieldByName("status"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return f.Uint()&1 == 0
		}
	}
	return false
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
