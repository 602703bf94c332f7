package readmetest_test

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/readmetest"
)

// TestLinks: every relative link of README.md and docs/*.md names a file
// or directory of the repository and, with a #anchor into a Markdown file,
// a heading (or an <a id>) of that file, so that moving a section to a page
// of docs/ cannot leave a link behind that leads nowhere.
func TestLinks(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		anchors[file] = readmetest.Anchors(md)
		return anchors[file]
	}
	checked := 0
	for _, file := range files {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range readmetest.Links(md) {
			checked++
			target := file
			if l.Path != "" {
				target = path.Clean(path.Join(path.Dir(file), l.Path))
			}
			if strings.HasPrefix(target, "../") {
				t.Errorf("%s:%d: %s leads out of the repository", file, l.Line, l.Path)
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
				t.Errorf("%s:%d: link to %s: no such file", file, l.Line, l.Path)
				continue
			}
			if l.Anchor != "" && strings.HasSuffix(target, ".md") && !anchorsOf(target)[l.Anchor] {
				t.Errorf("%s:%d: link to %s#%s: %s has no such heading", file, l.Line, l.Path, l.Anchor, target)
			}
		}
	}
	if checked == 0 {
		t.Error("no relative link found: the extraction broke")
	}
}

func TestLinksAndAnchors(t *testing.T) {
	t.Parallel()
	page := "# Top\n\n## How it works: the HTTP contract\n\n### `lock_timeout` on the pool's routes\n\n" +
		"## Top\n\n<a id=\"idempotency_in_flight\"></a>\n\n" +
		"See [a](docs/x.md#the-pool), [b](#top-1), ![c](img.svg \"title\"), [d](https://x.org/y), `[e](not.md)`.\n" +
		"```md\n[f](inside-a-fence.md)\n```\n[g]: ../up.md\n"
	gotLinks := readmetest.Links([]byte(page))
	wantLinks := []readmetest.Link{
		{Line: 11, Path: "docs/x.md", Anchor: "the-pool"},
		{Line: 11, Path: "", Anchor: "top-1"},
		{Line: 11, Path: "img.svg"},
		{Line: 15, Path: "../up.md"},
	}
	if len(gotLinks) != len(wantLinks) {
		t.Fatalf("links: got %+v, want %+v", gotLinks, wantLinks)
	}
	for i := range wantLinks {
		if gotLinks[i] != wantLinks[i] {
			t.Errorf("link %d: got %+v, want %+v", i, gotLinks[i], wantLinks[i])
		}
	}
	got := readmetest.Anchors([]byte(page))
	for _, a := range []string{"top", "top-1", "how-it-works-the-http-contract", "lock_timeout-on-the-pools-routes", "idempotency_in_flight"} {
		if !got[a] {
			t.Errorf("anchor %q missing from %v", a, got)
		}
	}
	if len(got) != 5 {
		t.Errorf("anchors: got %v, want exactly 5", got)
	}
}
