package readmetest_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/readmetest"
)

// root is the repository's top directory, seen from this package.
const root = "../.."

// markdown returns every Markdown file of the repository, relative to
// root, past hidden directories and testdata.
func markdown(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestSnippets compiles every Go snippet of the repository's Markdown and
// fails on each one that does not compile or drops an error.
func TestSnippets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the snippets' dependencies: not in -short")
	}
	var all []readmetest.Snippet
	perFile := map[string]int{}
	for _, file := range markdown(t) {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		snippets, err := readmetest.Extract(file, md)
		if err != nil {
			t.Error(err)
			continue
		}
		perFile[file] = len(snippets)
		all = append(all, snippets...)
	}
	// The pages whose snippets a newcomer copies first: finding none
	// there would mean the extraction broke, not that all is well.
	for _, file := range []string{"README.md", "docs/production.md"} {
		if perFile[file] == 0 {
			t.Errorf("%s: no Go snippet found", file)
		}
	}
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	problems, err := readmetest.Check(dir, all)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d snippets in %d files", len(all), len(perFile))
}
