package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestScriptsFollowTheSource generates the scripts from the repository's
// own statements (internal/pgsql) and example server, and checks that each holds the
// statements it promises, every $n bound to a pgbench variable or value.
func TestScriptsFollowTheSource(t *testing.T) {
	out := t.TempDir()
	if err := run("../../..", "../../../examples/server/postgres.go", out); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// Each script's statements in order, by a fragment of each.
	want := map[string][]string{
		"miss.sql":       {`\set key`, "INSERT INTO idempotency_keys", `\gset c_`, "UPDATE idempotency_keys SET status = 'completed'"},
		"hot_setup.sql":  {"INSERT INTO idempotency_keys", `\gset c_`, "UPDATE idempotency_keys"},
		"hot.sql":        {"INSERT INTO idempotency_keys"},
		"order.sql":      {`\set key`, "BEGIN;", "INSERT INTO paper_orders", "INSERT INTO audit_log", "COMMIT;"},
		"order_idem.sql": {`\set key`, "INSERT INTO idempotency_keys", `\gset c_`, "BEGIN;", "INSERT INTO paper_orders", "INSERT INTO audit_log", "UPDATE idempotency_keys", "COMMIT;"},
		"order_idem_tx_all.sql": {`\set key`, `\startpipeline`, "BEGIN;", "set_config('statement_timeout'", "SET LOCAL lock_timeout = '10ms'",
			"INSERT INTO idempotency_keys", "SAVEPOINT", "SET LOCAL lock_timeout", `\endpipeline`, "INSERT INTO paper_orders", "INSERT INTO audit_log",
			`\startpipeline`, "set_config('search_path'", "SET LOCAL ROLE NONE", "SET CONSTRAINTS ALL IMMEDIATE", "UPDATE idempotency_keys SET status = 'completed'",
			"COMMIT;", "current_setting('role')", `\endpipeline`},
	}
	unbound := regexp.MustCompile(`\$[0-9]`)
	for name, frags := range want {
		s := read(name)
		at := 0
		for _, f := range frags {
			i := strings.Index(s[at:], f)
			if i < 0 {
				t.Errorf("%s: %q missing or out of order:\n%s", name, f, s)
				break
			}
			at += i + len(f)
		}
		if unbound.MatchString(s) {
			t.Errorf("%s: a $n parameter left unbound:\n%s", name, s)
		}
	}
	// The middleware sends the owner token and the status as parameters.
	for _, name := range []string{"miss.sql", "hot.sql", "order_idem_tx.sql"} {
		if s := read(name); !strings.Contains(s, ":owner::uuid") || strings.Contains(s, "NULL::uuid") {
			t.Errorf("%s: the claim's owner token is not the :owner parameter:\n%s", name, s)
		}
	}
	if s := read("miss.sql"); !strings.Contains(s, "response_code = :code") {
		t.Errorf("miss.sql: the status is not the :code parameter:\n%s", s)
	}
	if s := read("order.sql"); strings.Contains(s, "idempotency_keys") {
		t.Errorf("order.sql (B's SQL) touches idempotency_keys:\n%s", s)
	}
	if s := read("example_schema.sql"); !strings.Contains(s, "CREATE TABLE IF NOT EXISTS paper_orders") {
		t.Errorf("example_schema.sql lacks the orders table:\n%s", s)
	}
}

// TestRunNamesAMissingStatement: a renamed constant is an error naming the
// file, not a script with a hole in it.
func TestRunNamesAMissingStatement(t *testing.T) {
	dir := t.TempDir()
	example := filepath.Join(dir, "postgres.go")
	if err := os.WriteFile(example, []byte("package main\n\nconst schemaSQL = `CREATE TABLE t (x int)`\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run("../../..", example, dir)
	if err == nil || !strings.Contains(err.Error(), "insertOrderSQL") {
		t.Fatalf("run with no insertOrderSQL: err = %v, want one naming it", err)
	}
}
