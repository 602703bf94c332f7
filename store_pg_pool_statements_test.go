package idempotency

import (
	"cmp"
	"go/ast"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/pgsql"
)

// TestPostgresStatementsListed: every constant named ...SQL in
// internal/pgsql (and any named pg...SQL left in the package's source) is
// in pgStatements, so a new statement cannot escape the Citus rules below;
// but the ones only sqlstore's PostgreSQL dialect sends (sqlstoreOnly).
func TestPostgresStatementsListed(t *testing.T) {
	var found []string
	for _, dir := range []struct{ path, prefix, pattern string }{
		{".", "", `^pg\w*SQL$`},
		{filepath.Join("internal", "pgsql"), "pgsql.", `^\w*SQL$`},
	} {
		name := regexp.MustCompile(dir.pattern)
		for _, file := range parseDir(t, dir.path) {
			ast.Inspect(file, func(n ast.Node) bool {
				if spec, ok := n.(*ast.ValueSpec); ok {
					for _, id := range spec.Names {
						if name.MatchString(id.Name) {
							found = append(found, dir.prefix+id.Name)
						}
					}
				}
				return true
			})
		}
	}
	for _, n := range found {
		if _, ok := pgStatements[n]; !ok && !slices.Contains(sqlstoreOnly, n) {
			t.Errorf("%s is a statement of the store missing from pgStatements: add it, so the Citus rules check it", n)
		}
	}
	for n := range pgStatements {
		if !slices.Contains(found, n) {
			t.Errorf("pgStatements lists %s, which the source no longer declares", n)
		}
	}
}

// batchOnly are group commit's statements, never sent to a Citus table:
// Check turns batching off there, so they may name many scopes, and a
// round's lock wait may be a set_config that would not reach the workers.
var batchOnly = []string{"pgsql.CompleteBatchSQL", "pgsql.RoundSettingsSQL"}

// sqlstoreOnly are the statements of internal/pgsql that only sqlstore's
// PostgreSQL dialect sends (it does not promise Citus).
var sqlstoreOnly = []string{"pgsql.CleanupSQL", "pgsql.PurgeSQL", "pgsql.EraseDeleteSQL", "pgsql.EraseKeptSQL", "pgsql.CustomPlanSQL"}

// TestPostgresStatementsCitusRules pins, on the SQL text, the rules a
// table distributed by scope_user_id (Citus) needs (docs/scaling.md, "Scale-out
// (Citus)"), on every statement the store and the CLI send.
func TestPostgresStatementsCitusRules(t *testing.T) {
	all := storeStatements()
	maps.Copy(all, cmdStatements(t))
	for _, name := range slices.Sorted(maps.Keys(all)) {
		t.Run(name, func(t *testing.T) {
			var msgs []string
			for _, p := range citusProblems(all[name]) {
				if (p.rule == ruleScope || p.rule == ruleLockWait) && slices.Contains(batchOnly, name) {
					continue // group commit is off on Citus (TestCitusTurnsBatchingOff)
				}
				msgs = append(msgs, p.rule+": "+p.detail)
			}
			if len(msgs) > 0 {
				t.Errorf("%s\n%s", strings.Join(msgs, "\n"), all[name])
			}
		})
	}
}

// storeStatements is pgStatements and Check's privilege probe (pgProbe).
func storeStatements() map[string]string {
	all := maps.Clone(pgStatements)
	for i, p := range pgProbe {
		all["pgProbe["+strconv.Itoa(i)+"]"] = p.sql
	}
	return all
}

// The rules, by the name citusProblems reports.
const (
	ruleScope     = "scope"     // an UPDATE or DELETE names scope_user_id = $n: one shard
	ruleRowLock   = "row-lock"  // a row lock only in a SELECT naming scope_user_id = $n
	ruleAgeByID   = "age-by-id" // never ORDER BY id: ids from different nodes are not ordered by time
	ruleReturning = "returning" // no function that is not IMMUTABLE in a RETURNING list (0A000)
	ruleSetting   = "setting"   // no custom setting read or set by a statement on the table (42704)
	ruleLockWait  = "lock-wait" // lock_timeout set with SET LOCAL, never set_config or a session SET
)

// citusProblem is one rule a statement breaks.
type citusProblem struct{ rule, detail string }

// citusProblems returns the rules sql breaks on a table distributed by
// scope_user_id.
func citusProblems(sql string) []citusProblem {
	toks := sqlTokens(sql)
	var out []citusProblem
	add := func(rule, detail string) { out = append(out, citusProblem{rule, detail}) }
	onTable := slices.ContainsFunc(toks, func(t sqlTok) bool { return t.is(pgTable) })
	for i, tk := range toks {
		switch {
		case at(toks, i, "update", pgTable) || at(toks, i, "delete", "from", pgTable):
			if !writeScoped(toks, i) {
				add(ruleScope, "an UPDATE or DELETE without scope_user_id = $n: it would reach every shard")
			}
		case tk.is("for") && (at(toks, i+1, "update") || at(toks, i+1, "share") || at(toks, i+1, "no") || at(toks, i+1, "key")):
			if !namesScope(toks, owningSelect(toks, i), i) {
				add(ruleRowLock, "a row lock in a SELECT without scope_user_id = $n: Citus refuses it across shards")
			}
		case at(toks, i, "order", "by") && orderedByID(toks, i+2):
			add(ruleAgeByID, "ORDER BY id: ids from different Citus nodes are not ordered by time")
		case tk.is("returning"):
			for _, fn := range notImmutable(toks[i+1 : clauseEnd(toks, i)]) {
				add(ruleReturning, "RETURNING computes "+fn+", not IMMUTABLE: Citus refuses it on a distributed table (0A000); "+
					"compute it in an outer SELECT over the CTE")
			}
		case (tk.is("current_setting") || tk.is("set_config")) && at(toks, i+1, "("):
			name := settingName(toks, i+2)
			if onTable && (name == "" || strings.Contains(name, ".")) {
				add(ruleSetting, tk.text+" of "+cmp.Or(name, "a setting named at run time")+" in a statement on the table: "+
					"a worker evaluating it does not have the coordinator's custom settings (42704)")
			}
			if tk.is("set_config") && name == "lock_timeout" {
				add(ruleLockWait, "set_config('lock_timeout', ...) never reaches the Citus workers: use SET LOCAL lock_timeout")
			}
		case (tk.is("set") || tk.is("reset")) && (i == 0 || toks[i-1].is(";")) && sessionLockTimeout(toks, i):
			add(ruleLockWait, strings.ToUpper(tk.text)+" lock_timeout without LOCAL outlives the transaction: use SET LOCAL lock_timeout")
		}
	}
	return out
}

// at reports whether the tokens from toks[i] are words (lower case).
func at(toks []sqlTok, i int, words ...string) bool {
	for k, w := range words {
		if i+k >= len(toks) || !toks[i+k].is(w) {
			return false
		}
	}
	return true
}

// writeScoped reports whether the UPDATE or DELETE at toks[i] has a WHERE
// naming scope_user_id = $n, outside its subqueries and before RETURNING.
func writeScoped(toks []sqlTok, i int) bool {
	d, end := toks[i].depth, clauseEnd(toks, i)
	where := -1
	for j := i; j < end; j++ {
		switch {
		case toks[j].depth != d:
		case toks[j].is("where") && where < 0:
			where = j
		case toks[j].is("returning"):
			end = j
		}
	}
	return where >= 0 && namesScope(toks, where, end)
}

// namesScope reports whether toks[from:to] hold scope_user_id = $n or
// scope_user_id = 'literal' (the column qualified or not; either routes to
// one shard) outside parenthesised subqueries.
func namesScope(toks []sqlTok, from, to int) bool {
	for i := from; i < to; i++ {
		if subquery(toks, i) {
			i = skipGroup(toks, i)
			continue
		}
		if toks[i].is("scope_user_id") && at(toks, i+1, "=") && i+2 < len(toks) &&
			(toks[i+2].kind == tokParam || toks[i+2].kind == tokString) {
			return true
		}
	}
	return false
}

// owningSelect returns the index of the SELECT whose clause toks[i] is:
// the last one before it at its depth.
func owningSelect(toks []sqlTok, i int) int {
	d := toks[i].depth
	for j := i - 1; j >= 0 && toks[j].depth >= d; j-- {
		if toks[j].depth == d && toks[j].is("select") {
			return j
		}
	}
	return 0
}

// orderedByID reports an ORDER BY whose first key, at toks[i], is the
// column id, qualified or not.
func orderedByID(toks []sqlTok, i int) bool {
	if at(toks, i+1, ".") {
		i += 2
	}
	return at(toks, i, "id") && !at(toks, i+1, ".") && !at(toks, i+1, "(")
}

var (
	// notCalls are the words a "(" follows that call no function.
	notCalls = wordSet("and", "or", "not", "in", "is", "exists", "any", "all", "some", "array", "values",
		"as", "case", "when", "then", "else", "filter", "over", "row", "select", "from", "where", "on", "using")
	// immutables are functions known to be IMMUTABLE for the types the
	// store passes them.
	immutables = wordSet("coalesce", "nullif", "greatest", "least", "cast", "lower", "upper", "length", "octet_length", "abs")
	// niladics are the SQL functions called without parentheses; none is
	// IMMUTABLE.
	niladics = wordSet("current_timestamp", "current_date", "current_time", "localtime", "localtimestamp",
		"current_user", "session_user", "current_role", "current_schema", "current_catalog")
)

func wordSet(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// notImmutable returns the calls in a RETURNING list that are not known
// to be IMMUTABLE (a type modifier after :: is no call).
func notImmutable(list []sqlTok) []string {
	var out []string
	for j, tk := range list {
		if tk.kind != tokWord {
			continue
		}
		call := at(list, j+1, "(") && !(j > 0 && list[j-1].is("::"))
		switch {
		case call && !notCalls[tk.text] && !immutables[tk.text]:
			out = append(out, tk.text+"()")
		case !call && niladics[tk.text]:
			out = append(out, tk.text)
		}
	}
	return out
}

// settingName is the setting a current_setting or set_config call names
// with the literal at toks[i], or "" when it names none literally.
func settingName(toks []sqlTok, i int) string {
	if i < len(toks) && toks[i].kind == tokString {
		return strings.ToLower(toks[i].text)
	}
	return ""
}

// sessionLockTimeout reports a SET (SESSION) lock_timeout or a RESET
// lock_timeout at toks[i]: a session's setting, not the transaction's.
func sessionLockTimeout(toks []sqlTok, i int) bool {
	if toks[i].is("set") && at(toks, i+1, "session") {
		i++
	}
	return at(toks, i+1, "lock_timeout")
}

// TestClaimArgsFitTheSQL: claimArgs gives pgsql.ClaimSQL exactly the parameters
// it numbers, as the raw-SQL benchmarks rely on (they send claimArgs too).
func TestClaimArgsFitTheSQL(t *testing.T) {
	top := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(pgsql.ClaimSQL, -1) {
		n, _ := strconv.Atoi(m[1])
		top = max(top, n)
	}
	if got := len(claimArgs(ClaimRequest{})); got != top {
		t.Errorf("claimArgs gives %d parameters, pgsql.ClaimSQL numbers %d", got, top)
	}
}
