package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/idemkit/idempotency/internal/sqlstate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The errors: the class table a failed call is read by (internal/sqlstate
// for the server's codes), the bounded retries, and Check's verdict on the
// table (ErrSchemaOutdated, a missing privilege).

// pgRetries bounds how many times a statement is run again when it read no
// row because of a concurrent commit, or failed with a serialization failure.
const pgRetries = 5

// retrySerialization runs f again, a bounded number of times, while it fails
// with a serialization failure or a deadlock (possible when the host runs
// its sessions at SERIALIZABLE or REPEATABLE READ); the failed statement
// changed nothing.
func retrySerialization(ctx context.Context, f func() error) error {
	var err error
	for range pgRetries {
		if err = f(); !isRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// isRetryable reports a serialization failure or a deadlock.
func isRetryable(err error) bool {
	if err == nil {
		return false // without errors.As, whose target escapes
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && sqlstate.PostgresRetryable(pgErr.Code)
}

// pgOwnerError translates err like pgStoreError but keeps ErrNotOwner as it
// is.
func pgOwnerError(op string, err error) error {
	if err == nil || errors.Is(err, ErrNotOwner) {
		return err
	}
	return pgStoreError(op, err)
}

// pgStoreError wraps a pgx error in a *StoreError for op.
func pgStoreError(op string, err error) error {
	return &StoreError{Op: op, Reason: pgReason(err), Err: explainPooler(err)}
}

// pgReason classifies a pgx error by the class table.
func pgReason(err error) string { return postgresClasses.reason(err) }

// postgresClasses is the class table's PostgreSQL column.
var postgresClasses = dialect{code: pgCode, codeReason: pgCodeReason,
	unsent: pgconn.SafeToRetry, linkFailed: pgLinkFailed, closed: pgPoolClosed, probeCode: sqlstate.PostgresProbe}

// pgLinkFailed reports pgx's own connection errors: a connect that failed
// without a server's answer (refused, TLS), or a connection pgx closed.
func pgLinkFailed(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed)
}

// pgPoolClosed reports a closed pool: pgxpool returns puddle's
// ErrClosedPool, a plain error, unwrapped or wrapped with a prefix.
func pgPoolClosed(err error) bool {
	return err.Error() == "closed pool" || strings.HasSuffix(err.Error(), ": closed pool")
}

// pgCode returns the SQLSTATE the server answered with, if any, also
// inside a *pgconn.ConnectError: a refused login is classified by its code.
func pgCode(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, true
	}
	return "", false
}

// pgCodeReason classifies a SQLSTATE by the shared table.
func pgCodeReason(code string) string { return sqlstate.Postgres(code) }

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

// retryConnLoss runs f, then once more when it failed because its
// connection was lost or shut down (isConnLoss): after a failover the pool
// still holds connections to the old primary, and pgx checks
// target_session_attrs only when it opens a connection, never retrying the
// statement in flight. Only claims, reads and ReleaseOwner go through it.
// When the lost attempt of a claim had committed, the retry finds that
// row: with an owner token (ClaimRequest.Owner) it recognises the row as
// its own and wins it (pgsql.ClaimSQL); without one it reads the row as
// someone else's claim in flight, and the request answers as a concurrent
// duplicate would (409) although nothing ran. A takeover whose
// reply was lost reads as lost (no row matches its fence any more); the
// caller's next Claim with the same token then wins the row.
//
// f is retried as retrySerialization does too.
func retryConnLoss(ctx context.Context, f func() error) error {
	err := retrySerialization(ctx, f)
	if isConnLoss(ctx, err) {
		err = retrySerialization(ctx, f)
	}
	return err
}

// isConnLoss reports an error from a lost, refused or shut-down connection
// (SQLSTATE class 08, 57P01 admin_shutdown and its kin, pgx's closed
// connection and network errors: pgReason's ReasonConnection and
// ReasonRemoteNode) while ctx
// still has time. A deadline that fired is never retried.
func isConnLoss(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	r := pgReason(err)
	return r == ReasonConnection || r == ReasonRemoteNode
}

// The class table of store errors: what
// a failed store call means for a fail-open route. Only a connection
// failure or a sent statement's timeout makes the route run the outage
// probe, and only a failed probe is a bypass (claimFailed). The server's
// codes are classified by internal/sqlstate, shared by every store; the
// pool, deadlines and the network are classified alike for every database.

// dialect is one database's column of the class table.
type dialect struct {
	code       func(error) (string, bool) // the server's error code inside err
	codeReason func(string) string        // the reason of a server's error code
	unsent     func(error) bool           // err reports that nothing was sent
	linkFailed func(error) bool           // the driver's own connection errors (refused, TLS, closed)
	closed     func(error) bool           // the pool or handle was closed
	probeCode  func(string) string        // the outage probe's verdict on a server's code; "" when it answered
}

// reason classifies err: the acquire's verdict, a closed store, the
// server's code, then how the call died on its way.
func (d dialect) reason(err error) string {
	var acq *acquireError
	var netErr net.Error
	code, coded := d.code(err)
	switch {
	case errors.As(err, &acq):
		return ReasonPoolExhausted
	case d.closed(err):
		return ReasonClosed
	case coded:
		return d.codeReason(code)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr) && netErr.Timeout():
		if d.unsent(err) {
			// The deadline passed before the statement left: the time went
			// to the acquire or to earlier attempts, a wait on the pool.
			return ReasonPoolExhausted
		}
		return ReasonTimeout // a sent statement with no reply before the deadline
	case errors.As(err, &netErr), d.linkFailed(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return ReasonConnection
	}
	return ReasonOther
}

// probeVerdict is the outage probe's verdict on what it got (Store.Probe):
// nil when the database answered, ReasonConnection when it could not be
// reached, ReasonAuth or ReasonTooManyConnections when it refused the
// login, and ReasonOther for anything else (503, never a bypass).
func (d dialect) probeVerdict(err error) error {
	if err == nil {
		return nil
	}
	reason := ReasonOther
	code, coded := d.code(err)
	switch r := d.reason(err); {
	case errors.Is(err, context.Canceled): // the caller gave up: no evidence either way
	case coded:
		if reason = d.probeCode(code); reason == "" {
			return nil // the database answered
		}
	case r == ReasonConnection, r == ReasonTimeout, r == ReasonPoolExhausted:
		reason = ReasonConnection // no answer, whichever way it failed
	}
	return &StoreError{Op: "probe", Reason: reason, Err: err}
}

// acquireError is a failed wait for a pooled connection, with the pool's
// state when it failed, for the log. Whatever that state, it is
// pool_exhausted: every connection in use is
// saturation, and a pool still opening a connection is no evidence of an
// outage either; only the outage probe is.
type acquireError struct {
	err                 error
	inUse, opening, max int32
}

func (e *acquireError) Error() string {
	return fmt.Sprintf("no pooled connection before the deadline (%d of %d in use, %d being opened): %v",
		e.inUse, e.max, e.opening, e.err)
}

func (e *acquireError) Unwrap() error { return e.err }

// pgNeededColumns are the columns the store reads or writes.
var pgNeededColumns = []string{
	"id", "idem_key", "scope_user_id", "scope_endpoint", "request_hash",
	"response_code", "response_body", "response_body_raw", "response_headers",
	"status", "attempt", "created_at", "locked_at", "locked_until", "expires_at", "owner_token", "seal_key_id", "retain_until",
}

// pgRound4Columns are the columns migration 000002_round4 adds.
var pgRound4Columns = []string{"derive_key_id", "purged"}

// pgByteaColumns are the columns the store reads and writes as bytes: an
// older version of migration 000001 made the hash TEXT and the body and
// headers JSONB.
var pgByteaColumns = []string{"request_hash", "response_body", "response_body_raw", "response_headers"}

// ErrSchemaOutdated is returned, wrapped, by PostgresStore.Check for a
// table that lacks a column or constraint the store needs.
var ErrSchemaOutdated = errors.New("idempotency: the table's schema is outdated")

// Check implements Store: the table (none: ReasonSchema), its columns and
// unique key (ErrSchemaOutdated, wrapped), the role's privileges
// (ReasonPermission), each error naming what is missing.
func (s *PostgresStore) Check(ctx context.Context) error {
	// The privileges: SELECT, INSERT, UPDATE and DELETE on the table and
	// USAGE on its id sequence, which a rolled-back probe transaction uses. An
	// outdated table: docs/stores.md "Upgrading an old version-1 database".
	var (
		cols   []string
		bytea  []string
		unique bool
		table  string
	)
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			return c.poolConn.QueryRow(ctx, pgsql.CheckSQL, s.pool.table()).Scan(&cols, &unique, &bytea, &table)
		})
	})
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return &StoreError{Op: "check", Reason: ReasonSchema,
				Err: errors.New("no idempotency_keys table in the search_path: run the migrations (migrations.Migrate, or idempotency migrate up)")}
		}
		return pgStoreError("check", err)
	}
	s.pool.resolve(table) // the store's table from now on (store_pg_pool.go)
	var missing []string
	for _, c := range pgNeededColumns {
		if !slices.Contains(cols, c) {
			missing = append(missing, "column "+c)
		}
	}
	for _, c := range pgByteaColumns {
		if slices.Contains(cols, c) && !slices.Contains(bytea, c) {
			missing = append(missing, "column "+c+" of type BYTEA")
		}
	}
	if !unique {
		missing = append(missing, "constraint uq_idem_key_user_endpoint UNIQUE (idem_key, scope_user_id, scope_endpoint)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the idempotency_keys table lacks %s: it was made by an older, unreleased version of migration 000001; "+
			"reset it as docs/stores.md \"Upgrading an old version-1 database\" says", ErrSchemaOutdated, strings.Join(missing, ", "))
	}
	for _, c := range pgRound4Columns {
		if !slices.Contains(cols, c) {
			missing = append(missing, "column "+c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the idempotency_keys table lacks %s: apply migration 000002_round4 "+
			"(migrations.Migrate, or idempotency migrate up)", ErrSchemaOutdated, strings.Join(missing, ", "))
	}
	if err := s.checkCitus(ctx, table); err != nil {
		return pgStoreError("check", err)
	}
	return s.checkPrivileges(ctx)
}

// checkCitus turns group commit off when table is distributed by Citus
// (pgsql.CitusSQL, pgsql.CitusTableSQL): a batch would span shards.
func (s *PostgresStore) checkCitus(ctx context.Context, table string) error {
	return s.withConn(ctx, func(c pgConn) error {
		var citus, distributed bool
		if err := c.QueryRow(ctx, pgsql.CitusSQL).Scan(&citus); err != nil || !citus {
			return err
		}
		if err := c.QueryRow(ctx, pgsql.CitusTableSQL, table).Scan(&distributed); err != nil {
			return err
		}
		s.distributed(distributed)
		return nil
	})
}

// distributed turns group commit off for a table Citus distributes.
func (s *PostgresStore) distributed(yes bool) {
	if yes {
		s.SetBatching(1, 0)
	}
}

// pgProbe is Check's privilege probe, in the order a claim and its record
// need them: each statement needs one privilege more than the ones before
// it. The row it writes is rolled back; the sequence value it takes is not
// (ids have gaps anyway).
//
// $1 key, $2 endpoint, after the first.
var pgProbe = []struct{ privilege, sql string }{
	{"USAGE on sequence idempotency_keys_id_seq", `SELECT nextval(pg_get_serial_sequence('idempotency_keys', 'id'))`},
	{"INSERT on table idempotency_keys", `INSERT INTO idempotency_keys
	(idem_key, scope_endpoint, request_hash, locked_until, expires_at) VALUES ($1, $2, '', now(), now())`},
	{"SELECT on table idempotency_keys", `SELECT id FROM idempotency_keys
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
	{"UPDATE on table idempotency_keys", `UPDATE idempotency_keys SET attempt = attempt + 1
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
	{"DELETE on table idempotency_keys", `DELETE FROM idempotency_keys
	WHERE idem_key = $1 AND scope_user_id = '' AND scope_endpoint = $2`},
}

// checkPrivileges runs pgProbe, pipelined, in a transaction it rolls back.
func (s *PostgresStore) checkPrivileges(ctx context.Context) error {
	var failed int // the probe statement that failed
	err := retryConnLoss(ctx, func() error {
		return s.withConn(ctx, func(c pgConn) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			b := &pgx.Batch{}
			key := "idempotency-check-" + uuid.NewString()
			b.Queue(pgProbe[0].sql)
			for _, p := range pgProbe[1:] {
				b.Queue(p.sql, key, "idempotency Check probe")
			}
			br := tx.SendBatch(ctx, b)
			for failed = range pgProbe {
				if _, err := br.Exec(); err != nil {
					_ = br.Close()
					return err
				}
			}
			return br.Close()
		})
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return &StoreError{Op: "check", Reason: ReasonPermission, Err: fmt.Errorf(
			"the pool's role (user %q) lacks %s, which the store needs: GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys "+
				"and USAGE ON SEQUENCE idempotency_keys_id_seq to it: %w", s.pool.Config().ConnConfig.User, pgProbe[failed].privilege, err)}
	}
	if err != nil {
		return pgStoreError("check", err)
	}
	return nil
}
