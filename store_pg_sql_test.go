package idempotency

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pgStatements is every SQL statement the Postgres store sends, by the
// name of its constant. TestPostgresStatementsListed keeps it complete.
var pgStatements = map[string]string{
	"pgClaimSQL":               pgClaimSQL,
	"pgTakeoverSQL":            pgTakeoverSQL,
	"pgCompleteSQL":            pgCompleteSQL,
	"pgFailSQL":                pgFailSQL,
	"pgReleaseSQL":             pgReleaseSQL,
	"pgReleaseOwnerSQL":        pgReleaseOwnerSQL,
	"pgExpiredBatchSQL":        pgExpiredBatchSQL,
	"pgDeleteExpiredSQL":       pgDeleteExpiredSQL,
	"pgDeleteScopeSQL":         pgDeleteScopeSQL,
	"pgExportScopeSQL":         pgExportScopeSQL,
	"pgTxSessionSQL":           pgTxSessionSQL,
	"pgTxBoundsSQL":            pgTxBoundsSQL,
	"pgTxTakeoverSQL":          pgTxTakeoverSQL,
	"pgTxRestoreSQL":           pgTxRestoreSQL,
	"pgSessionRestoreSQL":      pgSessionRestoreSQL,
	"pgSavepointSQL":           pgSavepointSQL,
	"pgRollbackToSavepointSQL": pgRollbackToSavepointSQL,
	"pgImmediateSQL":           pgImmediateSQL,
	"pgTxCompleteSQL":          pgTxCompleteSQL,
	"pgTxFailSQL":              pgTxFailSQL,
	"pgCommitSQL":              pgCommitSQL,
	"pgCheckSQL":               pgCheckSQL,
	"pgTxClaimSQL":             pgTxClaimSQL,
	"pgTxReadSQL":              pgTxReadSQL,
	"pgLookupSQL":              pgLookupSQL,
	"pgNowSQL":                 pgNowSQL,
	"pgStatsSQL":               pgStatsSQL,
	"pgCountCleanupSQL":        pgCountCleanupSQL,
	"pgReleaseKeySQL":          pgReleaseKeySQL,
}

// TestPostgresStatementsListed: every constant named pg...SQL in the
// package's source is in pgStatements, so a new statement cannot escape
// the Citus rules below.
func TestPostgresStatementsListed(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	name := regexp.MustCompile(`^pg\w*SQL$`)
	var found []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if spec, ok := n.(*ast.ValueSpec); ok {
				for _, id := range spec.Names {
					if name.MatchString(id.Name) {
						found = append(found, id.Name)
					}
				}
			}
			return true
		})
	}
	for _, n := range found {
		if _, ok := pgStatements[n]; !ok {
			t.Errorf("%s is a statement of the store missing from pgStatements: add it, so the Citus rules check it", n)
		}
	}
	for n := range pgStatements {
		if !slices.Contains(found, n) {
			t.Errorf("pgStatements lists %s, which the source no longer declares", n)
		}
	}
}

// TestPostgresStatementsCitusRules pins, on the SQL text, the rules a
// table distributed by scope_user_id (Citus) needs; README, "Scaling".
func TestPostgresStatementsCitusRules(t *testing.T) {
	for name, sql := range pgStatements {
		for _, problem := range citusProblems(sql) {
			t.Errorf("%s: %s\n%s", name, problem, sql)
		}
	}
}

// TestCitusProblemsCheck: the check finds what the store's statements
// held before the table was made ready for Citus, and passes what they
// hold now.
func TestCitusProblemsCheck(t *testing.T) {
	refused := map[string]string{
		"fenced by id alone": `UPDATE idempotency_keys SET status = 'failed'
WHERE id = $1 AND status = 'in_flight' AND attempt = $2`,
		"delete by id alone": `DELETE FROM idempotency_keys
WHERE id = $1 AND status = 'in_flight' AND attempt = $2`,
		"multi-shard SKIP LOCKED cleanup": `DELETE FROM idempotency_keys
WHERE id IN (
	SELECT id FROM idempotency_keys
	WHERE expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
AND expires_at < now() AND NOT (status = 'in_flight' AND locked_until >= now())`,
		"row lock without a scope":   `SELECT id FROM idempotency_keys WHERE idem_key = $1 FOR UPDATE`,
		"share lock without a scope": `SELECT id FROM idempotency_keys WHERE expires_at < now() FOR SHARE`,
		"age by id":                  `SELECT id FROM idempotency_keys WHERE expires_at < now() ORDER BY id LIMIT 10`,
		"age by qualified id":        `SELECT k.id FROM idempotency_keys k ORDER BY k.id DESC`,
		"scope compared otherwise":   `DELETE FROM idempotency_keys WHERE scope_user_id <> $1 AND id = $2`,
	}
	for what, sql := range refused {
		if len(citusProblems(sql)) == 0 {
			t.Errorf("%s: not refused:\n%s", what, sql)
		}
	}
	allowed := map[string]string{
		"scoped row lock": `SELECT id FROM idempotency_keys WHERE scope_user_id = $2 AND idem_key = $1 FOR UPDATE`,
		"oldest first":    `SELECT id FROM idempotency_keys WHERE scope_user_id = $1 ORDER BY created_at, id`,
		"scoped delete":   `DELETE FROM idempotency_keys WHERE scope_user_id = $1 AND id = ANY($2::bigint[])`,
	}
	for what, sql := range allowed {
		if p := citusProblems(sql); len(p) != 0 {
			t.Errorf("%s: refused: %v\n%s", what, p, sql)
		}
	}
}

var (
	// citusWrite starts an UPDATE or DELETE of the table.
	citusWrite = regexp.MustCompile(`(?i)\b(UPDATE|DELETE\s+FROM)\s+idempotency_keys\b`)
	// citusClause starts the next statement or subquery: a write's own
	// conditions end there.
	citusClause = regexp.MustCompile(`(?i)\b(SELECT|INSERT|UPDATE|DELETE|WITH)\b`)
	// citusScopeEq is an equality on the distribution column with a
	// parameter: the statement routes to one shard.
	citusScopeEq = regexp.MustCompile(`(?i)\bscope_user_id\s*=\s*\$\d+`)
	// citusRowLock is a row-locking clause.
	citusRowLock = regexp.MustCompile(`(?i)\bFOR\s+(UPDATE|SHARE|NO\s+KEY\s+UPDATE|KEY\s+SHARE)\b|\bSKIP\s+LOCKED\b`)
	// citusSelect starts a SELECT.
	citusSelect = regexp.MustCompile(`(?i)\bSELECT\b`)
	// citusOrderByID orders by id first: ids made on different nodes are
	// not ordered by time.
	citusOrderByID = regexp.MustCompile(`(?i)\bORDER\s+BY\s+(\w+\.)?id\b`)
)

// citusProblems returns what in sql breaks the rules of a table
// distributed by scope_user_id: an UPDATE or DELETE whose own conditions
// (up to the next SELECT, INSERT, UPDATE, DELETE or WITH) lack
// scope_user_id = $n; a row lock (FOR UPDATE, FOR SHARE, SKIP LOCKED) in
// a SELECT without scope_user_id = $n; an ORDER BY whose first key is id.
func citusProblems(sql string) []string {
	var out []string
	for _, loc := range citusWrite.FindAllStringIndex(sql, -1) {
		part := sql[loc[1]:]
		if next := citusClause.FindStringIndex(part); next != nil {
			part = part[:next[0]]
		}
		if !citusScopeEq.MatchString(part) {
			out = append(out, "an UPDATE or DELETE without scope_user_id = $n: it would reach every shard")
		}
	}
	for _, loc := range citusRowLock.FindAllStringIndex(sql, -1) {
		sel := citusSelect.FindAllStringIndex(sql[:loc[0]], -1)
		start := 0
		if len(sel) > 0 {
			start = sel[len(sel)-1][0]
		}
		if !citusScopeEq.MatchString(sql[start:loc[0]]) {
			out = append(out, "a row lock in a SELECT without scope_user_id = $n: Citus refuses it across shards")
		}
	}
	if citusOrderByID.MatchString(sql) {
		out = append(out, "ORDER BY id: ids from different Citus nodes are not ordered by time")
	}
	return out
}

// TestClaimArgsFitTheSQL: claimArgs gives pgClaimSQL exactly the parameters
// it numbers, as the raw-SQL benchmarks rely on (they send claimArgs too).
func TestClaimArgsFitTheSQL(t *testing.T) {
	top := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(pgClaimSQL, -1) {
		n, _ := strconv.Atoi(m[1])
		top = max(top, n)
	}
	if got := len(claimArgs(ClaimRequest{})); got != top {
		t.Errorf("claimArgs gives %d parameters, pgClaimSQL numbers %d", got, top)
	}
}
