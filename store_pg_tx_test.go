package idempotency

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsRowLockWait: a claim's lock wait is the key's row when the error
// has a context (PostgreSQL names the tuple it waited for), in any
// language and with any punctuation; a wait without one (another claim's
// speculative insertion, the table's extension) is not.
func TestIsRowLockWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code, where string
		want        bool
	}{
		{"55P03", `while checking uniqueness of tuple (0,5) in relation "idempotency_keys"`, true},
		{"55P03", `while locking tuple (12,3) in relation "idempotency_keys"`, true},
		{"55P03", `beim Prüfen der Eindeutigkeit von Tupel (0,5) in Relation »idempotency_keys«`, true},
		{"55P03", `0,5 튜플(해당 릴레이션: "idempotency_keys")의 고유성을 검사하는 중에 발생`, true}, // Korean: no parentheses
		{"55P03", ``, false},
		{"40001", `while locking tuple (0,1) in relation "idempotency_keys"`, false},
	} {
		err := fmt.Errorf("claim: %w", &pgconn.PgError{Code: c.code, Where: c.where})
		if got := isRowLockWait(err); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.code, c.where, got, c.want)
		}
	}
}

// txStatements are the statements a transactional route's transaction
// runs, by name.
var txStatements = map[string]string{
	"pgsql.TxSessionSQL":           pgsql.TxSessionSQL,
	"pgsql.TxBoundsSQL":            pgsql.TxBoundsSQL,
	"pgsql.TxClaimSQL":             pgsql.TxClaimSQL,
	"pgsql.TxReadSQL":              pgsql.TxReadSQL,
	"pgsql.TxTakeoverSQL":          pgsql.TxTakeoverSQL,
	"pgsql.SavepointSQL":           pgsql.SavepointSQL,
	"pgsql.RollbackToSavepointSQL": pgsql.RollbackToSavepointSQL,
	"pgsql.TxRestoreSQL":           pgsql.TxRestoreSQL,
	"pgsql.ImmediateSQL":           pgsql.ImmediateSQL,
	"pgsql.TxCompleteSQL":          pgsql.TxCompleteSQL,
	"pgsql.TxFailSQL":              pgsql.TxFailSQL,
	"pgsql.CommitSQL":              pgsql.CommitSQL,
	"pgsql.SessionRestoreSQL":      pgsql.SessionRestoreSQL,
	"the lock wait":                pgSetLocal("lock_timeout", "10ms"),
	"the lock wait's end":          pgSetLocal("lock_timeout", "0"),
	"the role put back":            pgSetRole("SET LOCAL ", "app"),
	"synchronous_commit back":      pgSetLocal("synchronous_commit", "on"),
}

var (
	// volatileCall is a call of a function Citus refuses in a RETURNING
	// list (not IMMUTABLE), or one that reads or sets a setting, which a
	// worker cannot see.
	volatileCall = regexp.MustCompile(`(?i)\b(now|set_config|current_setting|random|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday|nextval|gen_random_uuid)\s*\(`)
	// lockWaitByFunction sets lock_timeout with set_config, which never
	// reaches Citus workers.
	lockWaitByFunction = regexp.MustCompile(`(?i)set_config\s*\(\s*'lock_timeout'`)
)

// TestTxStatementsCitusReady: no statement of a transactional route calls
// a function that is not IMMUTABLE, or reads a setting, in its RETURNING
// list (Citus refuses the first with 0A000; a worker cannot see a
// coordinator's setting, 42704), and none sets the lock wait with
// set_config, which never reaches the workers; each passes the Citus
// rules of every statement (citusProblems), the ones built at run time
// too.
func TestTxStatementsCitusReady(t *testing.T) {
	for name, sql := range txStatements {
		for _, p := range citusProblems(sql) {
			t.Errorf("%s breaks rule %s: %s\n%s", name, p.rule, p.detail, sql)
		}
		if lockWaitByFunction.MatchString(sql) {
			t.Errorf("%s sets lock_timeout with set_config:\n%s", name, sql)
		}
		for _, list := range returningLists(sql) {
			if m := volatileCall.FindString(list); m != "" {
				t.Errorf("%s calls %s) in RETURNING:\n%s", name, m, sql)
			}
		}
	}
}

// returningLists returns the text of each RETURNING list of sql, up to the
// parenthesis that closes the statement it ends, or the end.
func returningLists(sql string) []string {
	var out []string
	for _, loc := range regexp.MustCompile(`(?i)\bRETURNING\b`).FindAllStringIndex(sql, -1) {
		rest, depth := sql[loc[1]:], 0
		end := len(rest)
	scan:
		for i, r := range rest {
			switch r {
			case '(':
				depth++
			case ')':
				if depth == 0 {
					end = i
					break scan
				}
				depth--
			}
		}
		out = append(out, rest[:end])
	}
	return out
}

// TestPgSetLocal: a setting's value goes into SET LOCAL only as the
// server shows a number with its unit or a word; anything else sets the
// default, so no text becomes SQL.
func TestPgSetLocal(t *testing.T) {
	for value, want := range map[string]string{
		"10ms":              `SET LOCAL lock_timeout = '10ms'`,
		"0":                 `SET LOCAL lock_timeout = '0'`,
		"1min":              `SET LOCAL lock_timeout = '1min'`,
		"remote_apply":      `SET LOCAL lock_timeout = 'remote_apply'`,
		"":                  `SET LOCAL lock_timeout TO DEFAULT`,
		"1s'; DROP TABLE x": `SET LOCAL lock_timeout TO DEFAULT`,
		"5 s":               `SET LOCAL lock_timeout TO DEFAULT`,
	} {
		if got := pgSetLocal("lock_timeout", value); got != want {
			t.Errorf("%q: %s, want %s", value, got, want)
		}
	}
	for role, want := range map[string]string{"none": `SET LOCAL ROLE NONE`, `app"x`: `SET LOCAL ROLE "app""x"`} {
		if got := pgSetRole("SET LOCAL ", role); got != want {
			t.Errorf("role %q: %s, want %s", role, got, want)
		}
	}
}
