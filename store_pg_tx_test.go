package idempotency

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsRowLockWait: a lock wait is the key's row when its context names
// a tuple by its id, in any language PostgreSQL reports it in; a
// table-level lock wait names none.
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
		{"55P03", `SQL statement "INSERT INTO idempotency_keys ..."`, false}, // a table lock
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
	"pgTxClaimSQL":    pgTxClaimSQL,
	"pgTxReadSQL":     pgTxReadSQL,
	"pgTxTakeoverSQL": pgTakeoverSQL,
	"pgTxCompleteSQL": pgTxCompleteSQL,
	"pgTxFailSQL":     pgTxFailSQL,
	"pgTxWaitSQL":     pgTxWaitSQL,
	"pgTxRestoreSQL":  pgTxRestoreSQL,
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
// set_config, which never reaches the workers.
func TestTxStatementsCitusReady(t *testing.T) {
	for name, sql := range txStatements {
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
