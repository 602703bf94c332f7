// Command releasecheck builds the module zip of every releasable module of
// the repository, as the Go module proxy would serve it at a tag, and fails
// when one holds an executable or is larger than the bound (make
// release/check; DESIGN.md "Ready to adopt").
//
// It zips what is committed at HEAD (git archive, via
// golang.org/x/mod/zip.CreateFromVCS), not the work tree, so a binary left
// by `go build` but never added is no failure, and one that was committed
// is, wherever it hides.
//
// Usage: go run ./cmd/releasecheck [-max bytes] [-version v0.1.0] [-rev HEAD] REPO_ROOT
package main

import (
	"archive/zip"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	maxBytes := flag.Int64("max", 2<<20, "largest module zip allowed, in bytes")
	version := flag.String("version", "v0.1.0", "version the zips are built for")
	rev := flag.String("rev", "HEAD", "the commit to zip")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: releasecheck [-max bytes] [-version v] [-rev commit] REPO_ROOT")
		os.Exit(2)
	}
	problems, err := check(flag.Arg(0), *rev, *version, *maxBytes, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "releasecheck:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "releasecheck:", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// check zips every module committed at rev under root and returns what is wrong
// with them; it prints one line per module.
func check(root, rev, version string, maxBytes int64, out io.Writer) ([]string, error) {
	dirs, err := moduleDirs(root, rev)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, dir := range dirs {
		path, err := modulePath(root, rev, filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		m := module.Version{Path: path, Version: version}
		subdir := dir
		if subdir == "." {
			subdir = "" // the repository root
		}
		if err := modzip.CreateFromVCS(&buf, m, root, rev, subdir); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		execs, files, err := executables(buf.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		fmt.Fprintf(out, "%-55s %4d files %9d bytes zipped\n", path, files, buf.Len())
		for _, e := range execs {
			problems = append(problems, fmt.Sprintf("%s: %s is an executable", path, e))
		}
		if int64(buf.Len()) > maxBytes {
			problems = append(problems, fmt.Sprintf("%s: the zip is %d bytes, over %d", path, buf.Len(), maxBytes))
		}
	}
	return problems, nil
}

// moduleDirs lists the directories, relative to root, of the committed
// go.mod files outside testdata/ (those are test inputs, not modules).
func moduleDirs(root, rev string) ([]string, error) {
	cmd := exec.Command("git", "ls-tree", "-r", "-z", "--name-only", rev)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-tree %s: %w", rev, err)
	}
	var dirs []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if filepath.Base(f) != "go.mod" || strings.Contains("/"+f, "/testdata/") {
			continue
		}
		dirs = append(dirs, filepath.Dir(f))
	}
	sort.Strings(dirs)
	return dirs, nil
}

// modulePath reads the module path of a go.mod file as committed at rev.
func modulePath(root, rev, gomod string) (string, error) {
	cmd := exec.Command("git", "show", rev+":"+filepath.ToSlash(gomod))
	cmd.Dir = root
	data, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git show %s:%s: %w", rev, gomod, err)
	}
	if p := modfile.ModulePath(data); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// executableMagic are the first bytes of ELF, Mach-O (and universal) and
// PE files: the formats `go build` writes.
var executableMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
	{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
}

// executables returns the names of the zip's entries that start like an
// executable, and how many entries it has.
func executables(data []byte) ([]string, int, error) {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, 0, err
	}
	var found []string
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			return nil, 0, err
		}
		head := make([]byte, 4)
		n, _ := io.ReadFull(rc, head)
		_ = rc.Close()
		for _, magic := range executableMagic {
			if n >= len(magic) && bytes.Equal(head[:len(magic)], magic) {
				found = append(found, f.Name)
				break
			}
		}
	}
	return found, len(zr.File), nil
}
