package migrations

import (
	"io/fs"
	"strconv"
	"strings"
	"testing"
)

// firstMigration runs before the table exists, so before it can be
// distributed (docs/scaling.md, "Scale-out (Citus)": create_distributed_table runs
// after migrate up): its statements may share the file. Every later file,
// up or down, is applied to a table that may already be distributed by
// Citus, which refuses a statement changing a distributed table (ALTER
// TABLE, CREATE INDEX, ...) that shares its migration with any other
// statement.
const firstMigration = "000001_create_idempotency_keys"

// TestMigrationStatementAlone: every migration after the first holds one
// statement and nothing else.
func TestMigrationStatementAlone(t *testing.T) {
	files, err := fs.Glob(FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	for _, name := range files {
		if strings.HasPrefix(name, firstMigration+".") {
			continue
		}
		text, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if msg := notAlone(string(text)); msg != "" {
			t.Errorf("%s: %s", name, msg)
		}
	}
}

// TestMigrationStatementAloneCheck: the check refuses a statement beside
// another, whatever the case, spacing, comments and quoted semicolons,
// ALTER TABLE as much as CREATE INDEX (the former check, CREATE INDEX only,
// passed the first two), and passes one statement alone.
func TestMigrationStatementAloneCheck(t *testing.T) {
	for _, tc := range []struct {
		sql     string
		refused bool
	}{
		{"ALTER TABLE idempotency_keys ADD COLUMN a int;\nALTER TABLE idempotency_keys ADD CONSTRAINT c CHECK (a > 0);\n", true},
		{"alter table idempotency_keys add column a int;\nUPDATE idempotency_keys SET a = 1;", true},
		{"ALTER TABLE idempotency_keys ADD COLUMN a int;\nCREATE INDEX i ON idempotency_keys (a);", true},
		{"CREATE  INDEX i ON idempotency_keys (a);\n-- a comment; with a semicolon\nCOMMENT ON INDEX i IS 'x; y';", true},
		{"-- POSTGRES-ONLY\nCREATE INDEX CONCURRENTLY i ON idempotency_keys (a);\n", false},
		{"create unique index i on idempotency_keys (a)", false},
		{"ALTER TABLE idempotency_keys ADD COLUMN a int;\n", false},
		{"CREATE INDEX i ON idempotency_keys (a); /* ; */ -- ;\n", false},
		{"ALTER TABLE t ADD COLUMN c text DEFAULT 'create index; x';", false},
	} {
		if got := notAlone(tc.sql) != ""; got != tc.refused {
			t.Errorf("%q: refused %v, want %v", tc.sql, got, tc.refused)
		}
	}
}

// notAlone returns why sql holds more than one statement, or "".
func notAlone(sql string) string {
	if stmts := statements(sql); len(stmts) > 1 {
		return "the migration holds " + strconv.Itoa(len(stmts)) + " statements (" + strings.Join(stmts, "; ") +
			"): give each a file of its own, as Citus requires of a statement changing a distributed table"
	}
	return ""
}

// statements splits sql at the semicolons that end statements, without
// comments (-- and /* */) and ignoring semicolons inside quotes, and
// returns the non-empty statements, trimmed.
func statements(sql string) []string {
	var (
		out []string
		cur strings.Builder
	)
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
			cur.WriteByte(' ')
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				i = len(sql)
			} else {
				i += 2 + end + 1
			}
			cur.WriteByte(' ')
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(sql) && sql[j] != c {
				j++
			}
			cur.WriteString(sql[i:min(j+1, len(sql))])
			i = j
		case c == ';':
			flush()
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return out
}
