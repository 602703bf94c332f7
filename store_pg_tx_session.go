package idempotency

// What a transactional route's handler does to its session never reaches
// the record, nor outlives its request (DESIGN.md "Safe as deployed"):
// the record and COMMIT run with the state the claim found, and after
// COMMIT the connection goes back to the pool as the store found it, or is
// destroyed.

import (
	"context"
	"errors"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// pgSession is the session's state a transactional route depends on, as
// pgsql.TxSessionSQL reads it.
type pgSession struct {
	role, searchPath, syncCommit, statement, lock, idle, user string
}

// scan reads pgsql.TxSessionSQL's row into s, and any columns after it into
// more.
func (s *pgSession) scan(row pgx.Row, more ...any) error {
	return row.Scan(append([]any{&s.role, &s.searchPath, &s.syncCommit, &s.statement, &s.lock, &s.idle, &s.user}, more...)...)
}

// lockTimeoutKey is where a connection's CustomData keeps its session's
// lock_timeout as last read, for the claim's batch to put back after the
// claim without a round trip of its own.
const lockTimeoutKey = "idempotency.lock_timeout"

// pgSetLocal is SET LOCAL name to value, a setting's value as the server
// shows it (a number with its unit, or a word such as "on"); any other
// text sets the default instead, so that no text the server returned
// becomes SQL.
func pgSetLocal(name, value string) string { return pgSet("SET LOCAL ", name, value) }

// pgSet is pgSetLocal with its SET command (SET or SET LOCAL).
func pgSet(set, name, value string) string {
	for _, r := range value {
		if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '_') {
			return set + name + " TO DEFAULT"
		}
	}
	if value == "" {
		return set + name + " TO DEFAULT"
	}
	return set + name + " = '" + value + "'"
}

// pgSetRole is SET (LOCAL) ROLE to role, as current_setting('role') shows
// it ("none": the session user's own).
func pgSetRole(set, role string) string {
	if role == "none" {
		return set + "ROLE NONE"
	}
	return set + "ROLE " + pgx.Identifier{role}.Sanitize()
}

// restoreSteps are the steps that put back, before the record, the state
// the claim found (its bounds in force): statement_timeout first (the
// handler's own bounds only that first statement), with search_path and
// idle_in_transaction_session_timeout, then the role, synchronous_commit
// and lock_timeout, with SET LOCAL, which Citus passes to its workers.
// With now (read just before, in pgx's simple protocol, where each SET
// LOCAL costs a round trip) only those that changed; with nil all of
// them, pipelined.
func (t *pgRouteTx) restoreSteps(now *pgSession) []pgStep {
	want := t.session
	want.statement, want.idle = t.bounds[0], t.bounds[1]
	var steps []pgStep
	if now == nil || now.statement != want.statement || now.searchPath != want.searchPath || now.idle != want.idle {
		steps = append(steps, pgStep{sql: pgsql.TxRestoreSQL, args: []any{want.statement, want.searchPath, want.idle}})
	}
	if now == nil || now.role != want.role {
		steps = append(steps, pgStep{sql: pgSetRole("SET LOCAL ", want.role), alone: true})
	}
	if now == nil || now.syncCommit != want.syncCommit {
		steps = append(steps, pgStep{sql: pgSetLocal("synchronous_commit", want.syncCommit), alone: true})
	}
	if now == nil || now.lock != want.lock {
		steps = append(steps, pgStep{sql: pgSetLocal("lock_timeout", want.lock), alone: true})
	}
	return steps
}

// beforeRecord returns the steps that put the claim's state back before
// the record, pipelined with it. The record names the table qualified
// (pgQualified), so pgx may parse it under whatever search_path the
// handler set. Under pgx's simple protocol it reads the state first, and
// only the settings that changed go back, each SET LOCAL alone.
func (t *pgRouteTx) beforeRecord(ctx context.Context) ([]pgStep, error) {
	if queryMode(t.tx.Conn()) != pgx.QueryExecModeSimpleProtocol {
		return t.restoreSteps(nil), nil
	}
	var now pgSession
	if err := now.scan(t.tx.QueryRow(ctx, pgsql.TxSessionSQL)); err != nil {
		return nil, err
	}
	return t.restoreSteps(&now), nil
}

// afterCommit puts the session back as BEGIN found it when the committed
// transaction changed it (now, read after COMMIT; nil when that read
// failed), and destroys the connection when it cannot: a handler's SET
// without LOCAL (search_path, role, a timeout) must not reach the next
// request on this connection.
func (t *pgRouteTx) afterCommit(ctx context.Context, now *pgSession) {
	if now != nil && *now == t.session {
		return
	}
	err := errors.New("the session state after COMMIT could not be read")
	if now != nil {
		err = t.restoreSession(ctx)
	}
	if err != nil {
		// Closed, the pool destroys it when it is given back.
		_ = t.c.Conn().Close(ctx)
	}
}

// restoreSession sets the session's state back to what BEGIN found, and
// checks it took.
func (t *pgRouteTx) restoreSession(ctx context.Context) error {
	s := t.session
	p := sendPipe(ctx, t.c.Conn(), t.q, false,
		pgStep{sql: pgSetRole("SET ", s.role)},
		pgStep{sql: pgsql.SessionRestoreSQL, args: []any{s.searchPath, s.statement, s.idle}},
		pgStep{sql: pgSet("SET ", "synchronous_commit", s.syncCommit)},
		pgStep{sql: pgSet("SET ", "lock_timeout", s.lock)},
		pgStep{sql: pgsql.TxSessionSQL})
	var err error
	for range 4 {
		if _, err = p.Exec(); err != nil {
			break
		}
	}
	var now pgSession
	if err == nil {
		err = now.scan(p.QueryRow())
	}
	if err = closeBatch(p, err); err == nil && now != s {
		err = errors.New("the session state could not be put back")
	}
	return err
}
