package migrations

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// firstMigration runs before the table exists, so before it can be
// distributed (README, "Scaling": create_distributed_table runs after
// migrate up): its CREATE INDEX statements may share the file with the
// CREATE TABLE. Every later file is applied to a table that may already be
// distributed by Citus, which refuses a CREATE INDEX sharing its migration
// with any other statement.
const firstMigration = "000001_create_idempotency_keys.up.sql"

// TestCreateIndexAloneInItsMigration: every up migration after the first
// that creates an index holds that one statement and nothing else.
func TestCreateIndexAloneInItsMigration(t *testing.T) {
	files, err := fs.Glob(FS, "*.up.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no up migrations: %v", err)
	}
	for _, name := range files {
		if name == firstMigration {
			continue
		}
		text, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if msg := createIndexNotAlone(string(text)); msg != "" {
			t.Errorf("%s: %s", name, msg)
		}
	}
}

// TestCreateIndexAloneCheck: the check itself finds a CREATE INDEX beside
// another statement, whatever the case and spacing, and only then.
func TestCreateIndexAloneCheck(t *testing.T) {
	for _, tc := range []struct {
		sql     string
		refused bool
	}{
		{"-- POSTGRES-ONLY\nCREATE INDEX CONCURRENTLY i ON idempotency_keys (a);\n", false},
		{"create unique index i on idempotency_keys (a)", false},
		{"ALTER TABLE idempotency_keys ADD COLUMN a int;\n", false},
		{"ALTER TABLE idempotency_keys ADD COLUMN a int;\nCREATE INDEX i ON idempotency_keys (a);", true},
		{"CREATE  INDEX i ON idempotency_keys (a);\n-- a comment; with a semicolon\nCOMMENT ON INDEX i IS 'x; y';", true},
		{"CREATE INDEX i ON idempotency_keys (a); /* ; */ -- ;\n", false},
		{"ALTER TABLE t ADD COLUMN c text DEFAULT 'create index; x';", false},
	} {
		if got := createIndexNotAlone(tc.sql) != ""; got != tc.refused {
			t.Errorf("%q: refused %v, want %v", tc.sql, got, tc.refused)
		}
	}
}

var createIndex = regexp.MustCompile(`(?i)^create\s+(unique\s+)?index\b`)

// createIndexNotAlone returns why sql holds a CREATE INDEX together with
// another statement, or "".
func createIndexNotAlone(sql string) string {
	stmts := statements(sql)
	for _, s := range stmts {
		if createIndex.MatchString(s) && len(stmts) > 1 {
			return "a CREATE INDEX shares its migration file with other statements (" +
				strings.Join(stmts, "; ") + "): give it a file of its own, as Citus requires on a distributed table"
		}
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
