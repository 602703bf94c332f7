package idempotency

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCitusRulesRejectTodaysStatements: each rule rejects, verbatim, the
// statements that failed on a real Citus cluster (13.2.2, issue 22),
// kept in testdata/citus as they were sent: the ordinary claim and the
// takeover computed now() in RETURNING; the transactional claim also read
// on the worker a custom setting only the coordinator had, and it, the
// takeover's wait, its restore and the CLI probe's wait set lock_timeout
// with set_config, which never reaches the workers.
func TestCitusRulesRejectTodaysStatements(t *testing.T) {
	want := map[string][]string{
		"pgClaimSQL.sql":             {ruleReturning},
		"pgTakeoverSQL.sql":          {ruleReturning},
		"pgTxClaimSQL.sql":           {ruleLockWait, ruleReturning, ruleSetting},
		"pgTxWaitSQL.sql":            {ruleLockWait},
		"pgTxRestoreSQL.sql":         {ruleLockWait},
		"cli_probe_lock_timeout.sql": {ruleLockWait},
	}
	files, err := filepath.Glob("testdata/citus/*.sql")
	if err != nil || len(files) != len(want) {
		t.Fatalf("testdata/citus holds %v (%v), want the %d statements below", files, err, len(want))
	}
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range citusProblems(string(sql)) {
			if !slices.Contains(got, p.rule) {
				got = append(got, p.rule)
			}
		}
		slices.Sort(got)
		if name := filepath.Base(f); !slices.Equal(got, want[name]) {
			t.Errorf("%s: rules broken %v, want %v", name, got, want[name])
		}
	}
}

// TestCitusProblemsCheck: each rule refuses what breaks it and passes the
// shapes the store uses instead, whatever CTEs, UNION ALL, subqueries,
// literals or comments surround it.
func TestCitusProblemsCheck(t *testing.T) {
	refused := map[string]struct{ rule, sql string }{
		"fenced by id alone":         {ruleScope, `UPDATE idempotency_keys SET status = 'failed' WHERE id = $1 AND status = 'in_flight' AND attempt = $2`},
		"delete by id alone":         {ruleScope, `DELETE FROM idempotency_keys WHERE id = $1 AND status = 'in_flight' AND attempt = $2`},
		"scope only in a subquery":   {ruleScope, `DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM idempotency_keys WHERE scope_user_id = $1)`},
		"scope only in RETURNING":    {ruleScope, `WITH u AS (UPDATE idempotency_keys SET attempt = 2 WHERE id = $1 RETURNING scope_user_id = $2) SELECT * FROM u`},
		"scope compared otherwise":   {ruleScope, `DELETE FROM idempotency_keys WHERE scope_user_id <> $1 AND id = $2`},
		"scope in a comment":         {ruleScope, `DELETE FROM idempotency_keys WHERE id = $2 -- AND scope_user_id = $1`},
		"row lock without a scope":   {ruleRowLock, `SELECT id FROM idempotency_keys WHERE idem_key = $1 FOR UPDATE`},
		"share lock without a scope": {ruleRowLock, `SELECT id FROM idempotency_keys WHERE expires_at < now() FOR SHARE`},
		"multi-shard SKIP LOCKED cleanup": {ruleRowLock, `DELETE FROM idempotency_keys WHERE scope_user_id = $2 AND id IN (
	SELECT id FROM idempotency_keys WHERE expires_at < now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`},
		"age by id":                 {ruleAgeByID, `SELECT id FROM idempotency_keys WHERE expires_at < now() ORDER BY id LIMIT 10`},
		"age by qualified id":       {ruleAgeByID, `SELECT k.id FROM idempotency_keys k ORDER BY k.id DESC`},
		"random() in RETURNING":     {ruleReturning, `INSERT INTO idempotency_keys (idem_key) VALUES ($1) RETURNING id, random() AS r`},
		"now() inside a CASE":       {ruleReturning, `UPDATE idempotency_keys SET attempt = 2 WHERE scope_user_id = $1 RETURNING CASE WHEN locked_until < now() THEN 1 END`},
		"current_timestamp":         {ruleReturning, `DELETE FROM idempotency_keys WHERE scope_user_id = $1 RETURNING id, current_timestamp`},
		"clock in a CTE's list":     {ruleReturning, `WITH d AS (DELETE FROM idempotency_keys WHERE scope_user_id = $1 RETURNING clock_timestamp() AS t) SELECT t FROM d`},
		"a custom setting in WHERE": {ruleSetting, `UPDATE idempotency_keys SET attempt = 2 WHERE scope_user_id = current_setting('app.user') AND scope_user_id = $1`},
		"a setting named by $n":     {ruleSetting, `SELECT id FROM idempotency_keys WHERE idem_key = current_setting($1)`},
		"session SET lock_timeout":  {ruleLockWait, `SET lock_timeout = '10ms'`},
		"SET SESSION lock_timeout":  {ruleLockWait, `SET SESSION lock_timeout TO '10ms'`},
		"RESET lock_timeout":        {ruleLockWait, `RESET lock_timeout`},
		"set_config in a CTE":       {ruleLockWait, `WITH b AS (SELECT set_config('LOCK_TIMEOUT', $1, true)) SELECT 1 FROM b`},
	}
	for what, tc := range refused {
		got := citusProblems(tc.sql)
		if !slices.ContainsFunc(got, func(p citusProblem) bool { return p.rule == tc.rule }) {
			t.Errorf("%s: not refused by rule %s (got %v):\n%s", what, tc.rule, got, tc.sql)
		}
	}
	allowed := map[string]string{
		"scoped row lock":    `SELECT id FROM idempotency_keys WHERE scope_user_id = $2 AND idem_key = $1 FOR UPDATE`,
		"oldest first":       `SELECT id FROM idempotency_keys WHERE scope_user_id = $1 ORDER BY created_at, id`,
		"scoped delete":      `DELETE FROM idempotency_keys WHERE scope_user_id = $1 AND id = ANY($2::bigint[])`,
		"the unscoped shard": `UPDATE idempotency_keys SET attempt = attempt + 1 WHERE idem_key = $1 AND scope_user_id = ''`,
		"scope in parentheses": `UPDATE idempotency_keys SET attempt = (SELECT 2) WHERE (k.scope_user_id = $3 AND id = $1)
	RETURNING id`,
		"flags over the CTE": `WITH ins AS (INSERT INTO idempotency_keys (idem_key) VALUES ($1) ON CONFLICT DO NOTHING
	RETURNING id, expires_at, 'now()' AS s, coalesce(attempt, 0)::numeric(10, 0) AS a /* now() */)
SELECT id, expires_at < now() AS expired FROM ins
UNION ALL
SELECT id, expires_at < now() FROM idempotency_keys WHERE scope_user_id = $2 AND NOT EXISTS (SELECT 1 FROM ins)`,
		"now() in SET and WHERE":         `UPDATE idempotency_keys SET locked_at = now() WHERE scope_user_id = $1 AND expires_at < now() RETURNING id`,
		"bounds of the coordinator":      `SELECT set_config('statement_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true)`,
		"SET LOCAL lock_timeout":         `SET LOCAL lock_timeout = '10ms'`,
		"SET LOCAL back to default":      `SET LOCAL lock_timeout TO DEFAULT`,
		"a custom setting off the table": `SELECT current_setting('idempotency.x', true)`,
	}
	for what, sql := range allowed {
		if p := citusProblems(sql); len(p) != 0 {
			t.Errorf("%s: refused: %v\n%s", what, p, sql)
		}
	}
}

// cmdStatements is every SQL statement the CLI (cmd/idempotency) declares,
// by the name of its constant (every name ending in SQL), as its source
// spells it: TestStatementsAreConstants makes sure it sends no other.
func cmdStatements(t *testing.T) map[string]string {
	t.Helper()
	consts := map[string]ast.Expr{}
	for _, file := range parseDir(t, filepath.Join("cmd", "idempotency")) {
		for _, decl := range file.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.CONST {
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if i < len(vs.Values) {
							consts[id.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	var eval func(ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(e.Value)
			return s, e.Kind == token.STRING && err == nil
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.Ident:
			if v, ok := consts[e.Name]; ok {
				return eval(v)
			}
		case *ast.BinaryExpr:
			a, aok := eval(e.X)
			b, bok := eval(e.Y)
			return a + b, aok && bok && e.Op == token.ADD
		}
		return "", false
	}
	out := map[string]string{}
	for name, e := range consts {
		if strings.HasSuffix(name, "SQL") {
			s, ok := eval(e)
			if !ok {
				t.Fatalf("cmd/idempotency: cannot evaluate the constant %s", name)
			}
			out["cmd/idempotency."+name] = s
		}
	}
	if len(out) == 0 {
		t.Fatal("cmd/idempotency declares no ...SQL constant")
	}
	return out
}

// parseDir parses the non-test Go files of dir.
func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestStatementsAreConstants: the store and the CLI send SQL only through
// named constants (no literal in a Query, QueryRow, Exec or Queue call),
// so every statement is one the Citus rules above check.
func TestStatementsAreConstants(t *testing.T) {
	sqlArg := map[string]int{"Query": 1, "QueryRow": 1, "Exec": 1, "Queue": 0}
	for _, dir := range []string{".", filepath.Join("cmd", "idempotency")} {
		for _, f := range parseDir(t, dir) {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if i, ok := sqlArg[sel.Sel.Name]; ok && i < len(call.Args) {
					if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						t.Errorf("%s: %s sends the literal %s: name it as a constant ending in SQL, so the Citus rules check it",
							dir, sel.Sel.Name, lit.Value)
					}
				}
				return true
			})
		}
	}
}

// TestStatementsQualify: every statement names the table as an
// identifier, or as a literal of its own (pg_get_serial_sequence's
// argument), never as part of another literal or a quoted name, so
// qualifying it (store_pg_pool.go) rewrites each of those names and
// nothing else; a literal doubles the quotes of the name it holds.
func TestStatementsQualify(t *testing.T) {
	const table = `"a b".idempotency_keys`
	q := newPgQualified(table)
	for name, sql := range storeStatements() {
		names := 0
		for _, tk := range sqlTokens(sql) {
			switch {
			case tk.is(pgTable) || tk.kind == tokString && tk.text == pgTable:
				names++
			case (tk.kind == tokString || tk.kind == tokIdent) && strings.Contains(tk.text, pgTable):
				t.Errorf("%s names the table inside %q: pass the name as a parameter", name, tk.text)
			}
		}
		got := q.of(sql)
		if n := strings.Count(got, table); n != names || strings.Count(got, pgTable) != names {
			t.Errorf("%s: %d qualified names of %d:\n%s", name, n, names, got)
		}
	}
	if got, want := qualify(`SELECT 'idempotency_keys', x FROM idempotency_keys`, `"a'b".idempotency_keys`),
		`SELECT '"a''b".idempotency_keys', x FROM "a'b".idempotency_keys`; got != want {
		t.Errorf("qualify: %s, want %s", got, want)
	}
}
