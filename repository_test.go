package idempotency_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// maxTrackedFile bounds a tracked file: anything larger is a build output or
// a data dump, not source, and would ship in the module zip.
const maxTrackedFile = 2 << 20

// executableMagic are the first bytes of the executable formats Go builds:
// ELF, Mach-O (both byte orders, 32 and 64 bit, and universal) and PE.
var executableMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
	{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
}

// TestNoTrackedExecutables fails on a committed binary or oversized file:
// `go build` in a command's directory leaves its binary there, and one
// `git add .` would ship it to every user of the module (three did, 41 MB).
// It skips outside a git checkout (the module zip has no history).
func TestNoTrackedExecutables(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z", "--full-name", ":/").Output()
	if err != nil {
		t.Skip("not a git checkout (or git missing): nothing to check")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	root := strings.TrimSpace(string(top))
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		path := root + "/" + name
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		if info.Size() > maxTrackedFile {
			t.Errorf("%s is tracked and %d bytes (over %d): remove it and ignore it", name, info.Size(), maxTrackedFile)
			continue
		}
		if isExecutable(t, path) {
			t.Errorf("%s is a tracked executable: remove it (git rm --cached) and add it to .gitignore", name)
		}
	}
}

// isExecutable reports whether the file at path starts like a binary.
func isExecutable(t *testing.T, path string) bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := f.Read(head)
	for _, magic := range executableMagic {
		if n >= len(magic) && bytes.Equal(head[:len(magic)], magic) {
			return true
		}
	}
	return false
}
