package readmetest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeShape holds the README to the layout DESIGN.md "Ready to
// adopt" asks for (DESIGN-settled-r3 item 26): at most 600 lines, a table
// of contents, a picture of the request's way that renders on GitHub (a
// Mermaid fence), "Testing your handlers", and a short section for each
// deep topic that links its page under docs/.
func TestReadmeShape(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	if n := strings.Count(md, "\n"); n > 600 {
		t.Errorf("README.md has %d lines, more than 600: move the detail to a page of docs/", n)
	}
	if !strings.Contains(md, "\n```mermaid\n") {
		t.Error("README.md has no ```mermaid picture of the request's way")
	}
	sections := map[string]string{} // heading -> its text, up to the next level-2 heading
	for _, part := range strings.Split("\n"+md, "\n## ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		sections[heading] = body
	}
	for _, h := range []string{"Contents", "Install", "Quick start", "Testing your handlers", "Stores", "Storage"} {
		if _, ok := sections[h]; !ok {
			t.Errorf("README.md has no ## %s section", h)
		}
	}
	link := regexp.MustCompile(`\]\(docs/[a-z-]+\.md[#)]`)
	for _, h := range []string{"Frameworks", "Observability", "Operations", "Scaling", "Clients", "Transactional routes"} {
		body, ok := sections[h]
		switch {
		case !ok:
			t.Errorf("README.md has no ## %s section", h)
		case !link.MatchString(body):
			t.Errorf("README.md's ## %s links no page of docs/", h)
		case strings.Count(body, "\n") > 25:
			t.Errorf("README.md's ## %s has %d lines: keep it a few lines and the link", h, strings.Count(body, "\n"))
		}
	}
	if !link.MatchString(sections["Quick start"]) || !strings.Contains(sections["Quick start"], "docs/production.md") {
		t.Error("README.md's quick start does not link docs/production.md")
	}
}
