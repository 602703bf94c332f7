// Package sqlstate is the one class table of database error codes, read by
// every store and tool that talks to the database: the pgx store,
// sqlstore's PostgreSQL and MySQL dialects and the migration runner. Two
// copies drifted once (57014 was a timeout on one store and "other" on the
// other), so no code is classified anywhere else.
//
// It returns reason strings, the values of the root package's Reason
// constants (this package cannot import the root); a root test holds them
// equal.
package sqlstate

// Reasons, equal to the root package's Reason constants of the same name.
const (
	Connection         = "connection"
	TooManyConnections = "too_many_connections"
	Auth               = "auth"
	Schema             = "schema"
	Permission         = "permission"
	LockTimeout        = "lock_timeout"
	StatementTimeout   = "statement_timeout"
	RemoteNode         = "remote_node"
	Conflict           = "conflict"
	Data               = "data"
	Other              = "other"
)

// Postgres returns the reason of a SQLSTATE that a PostgreSQL server (or a
// Citus coordinator, or PgBouncer) answered with.
func Postgres(code string) string {
	switch code {
	case "53300": // too_many_connections: saturation, the server answered
		return TooManyConnections
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return Connection
	case "57014": // query_canceled: statement_timeout or a cancel request; the server answered
		return StatementTimeout
	case "3D000": // invalid_catalog_name: the connection names no such database
		return Auth
	case "3F000", // invalid_schema_name
		"42P01", // undefined_table
		"42703", // undefined_column
		"42P10", // invalid_column_reference: the unique constraint ON CONFLICT needs is missing
		"42704", // undefined_object: a setting a Citus worker does not know
		"0A000": // feature_not_supported: a statement Citus cannot distribute
		return Schema
	case "42501": // insufficient_privilege
		return Permission
	case "55P03": // lock_not_available: lock_timeout ran out (DDL, a migration)
		return LockTimeout
	}
	if PostgresRetryable(code) {
		return Conflict
	}
	switch class(code) {
	case "08": // connection_exception in a server's answer: a Citus coordinator (or
		// PgBouncer) that answered for a node behind it. No message text is read.
		return RemoteNode
	case "53", "58", "XX": // resources, system, internal: the server failed
		return Connection
	case "28": // invalid_authorization_specification: a refused login
		return Auth
	case "22", // data_exception: a value the column cannot hold
		"54": // program_limit_exceeded: e.g. an index row too large
		return Data
	}
	return Other
}

// PostgresRetryable reports a SQLSTATE after which the failed statement
// changed nothing and may run again: serialization_failure (40001) and
// deadlock_detected (40P01).
func PostgresRetryable(code string) bool { return code == "40001" || code == "40P01" }

// PostgresProbe returns the verdict of the outage probe on a SQLSTATE its
// connect or its SELECT 1 got: Connection (the probe failed: class 08,
// including PgBouncer's own for a server it cannot reach, and 57P01-57P03),
// Auth (class 28, 3D000) or TooManyConnections (53300), each of which the
// caller reports; "" when the database answered.
func PostgresProbe(code string) string {
	switch {
	case class(code) == "08", code == "57P01", code == "57P02", code == "57P03":
		return Connection
	case class(code) == "28", code == "3D000":
		return Auth
	case code == "53300":
		return TooManyConnections
	}
	return ""
}

// MySQL returns the reason of a MySQL or MariaDB error number.
func MySQL(number uint16) string {
	switch number {
	case 2002, 2003, 2006, 2013, // cannot connect, server gone, connection lost
		1053, 1927: // server shutdown, connection killed
		return Connection
	case 1040: // too many connections
		return TooManyConnections
	case 1044, 1045, 1049: // access denied to the database, for the user; unknown database
		return Auth
	case 1054, 1146: // unknown column, no such table
		return Schema
	case 1142, 1143, 1227: // table, column, operation denied
		return Permission
	case 1205: // lock wait timeout
		return LockTimeout
	case 1969, 3024: // MariaDB max_statement_time, MySQL max_execution_time
		return StatementTimeout
	case 1213: // deadlock
		return Conflict
	case 1406, 1366, 1292, 1264, 3140, 4025: // values the columns refuse
		return Data
	}
	return Other
}

// MySQLProbe is PostgresProbe for a MySQL or MariaDB error number.
func MySQLProbe(number uint16) string {
	switch number {
	case 2002, 2003, 2006, 2013, 1053, 1927:
		return Connection
	case 1044, 1045, 1049:
		return Auth
	case 1040:
		return TooManyConnections
	}
	return ""
}

// class is a SQLSTATE's first two characters.
func class(code string) string { return code[:min(2, len(code))] }
