package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckFindsCommittedExecutable builds a repository with a root module
// and a nested one, commits an executable into the nested one, and expects
// check to name it and nothing in the clean root module.
func TestCheckFindsCommittedExecutable(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/r\n\ngo 1.26\n")
	write("r.go", "package r\n")
	write("sub/go.mod", "module example.com/r/sub\n\ngo 1.26\n")
	write("sub/s.go", "package sub\n")
	write("sub/cmd/tool/tool", "\x7fELF\x02\x01\x01 pretend binary")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-qm", "x")

	problems, err := check(root, "HEAD", "v0.1.0", 2<<20, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "example.com/r/sub@v0.1.0/cmd/tool/tool is an executable") {
		t.Fatalf("problems = %q, want exactly the nested module's executable", problems)
	}
	if problems, err = check(root, "HEAD", "v0.1.0", 10, io.Discard); err != nil || len(problems) != 3 {
		t.Fatalf("with a 10-byte bound: problems = %q, err = %v; want the executable and two zips over the bound", problems, err)
	}
}
