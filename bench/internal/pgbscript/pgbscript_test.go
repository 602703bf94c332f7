package pgbscript

import "testing"

func TestBind(t *testing.T) {
	got := Bind("WHERE a = $1 AND b = $2 AND c = $10 AND d = $3", []string{":a", ":b"})
	if want := "WHERE a = :a AND b = :b AND c = $10 AND d = $3"; got != want {
		t.Fatalf("Bind: %q, want %q", got, want)
	}
}

func TestOneLine(t *testing.T) {
	if got, want := OneLine("SELECT 1,\n\t2\n  FROM t"), "SELECT 1, 2 FROM t"; got != want {
		t.Fatalf("OneLine: %q, want %q", got, want)
	}
}
