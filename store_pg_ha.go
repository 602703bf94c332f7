package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// poolerHint is what a prepared-statement error from a transaction-mode
// pooler means.
const poolerHint = "prepared statements do not survive between transactions: behind a transaction-mode pooler " +
	"(PgBouncer pool_mode=transaction) set default_query_exec_mode=exec or cache_describe in the connection string"

// explainPooler adds poolerHint to the errors pgx's default statement cache
// gets behind a transaction-mode pooler, where each transaction may run on
// another server connection: a named statement that already exists there
// (42P05, duplicate_prepared_statement) or is missing (26000,
// invalid_sql_statement_name). Other errors are returned as they are.
func explainPooler(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		return fmt.Errorf("%w (%s)", err, poolerHint)
	}
	return err
}

// jsonbArg passes JSON bytes for a JSONB parameter as a json.RawMessage:
// with default_query_exec_mode=exec pgx does not know the parameter's type
// and would send plain []byte as bytea (hex text) that JSONB refuses. nil
// stays NULL.
func jsonbArg(b []byte) json.RawMessage { return json.RawMessage(b) }
