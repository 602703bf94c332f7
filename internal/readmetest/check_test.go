package readmetest_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/readmetest"
)

const fence = "```"

// md builds a Markdown page: some prose, then the fence (an optional
// marker line first), so that the snippet's first line of code is line 5.
func md(marker, lang, code string) string {
	if marker == "" {
		return "# page\n\ntext\n" + fence + lang + "\n" + code + "\n" + fence + "\n"
	}
	return "# page\n\n" + marker + "\n" + fence + lang + "\n" + code + "\n" + fence + "\n"
}

func TestExtract(t *testing.T) {
	t.Parallel()
	page := md("", "go", "x := 1") + "\n" + fence + "sh\nnot go at all {\n" + fence + "\n" + fence + "text\nfunc(\n" + fence + "\n" +
		"  <!-- snippet: func(w http.ResponseWriter, r *http.Request) -->\n  " + fence + "go\n  w.WriteHeader(201)\n  " + fence + "\n" +
		"<!-- snippet: declarations -->\n" + fence + "golang\nfunc f() {}\n" + fence + "\n" +
		fence + "go\n// a file\npackage main\n" + fence + "\n"
	got, err := readmetest.Extract("p.md", []byte(page))
	if err != nil {
		t.Fatal(err)
	}
	want := []readmetest.Snippet{
		{File: "p.md", Line: 5, Kind: readmetest.Body, Signature: "func()", Code: "x := 1\n"},
		{File: "p.md", Line: 16, Kind: readmetest.Body, Signature: "func(w http.ResponseWriter, r *http.Request)", Code: "w.WriteHeader(201)\n"},
		{File: "p.md", Line: 20, Kind: readmetest.Declarations, Signature: "func()", Code: "func f() {}\n"},
		{File: "p.md", Line: 23, Kind: readmetest.File, Signature: "func()", Code: "// a file\npackage main\n"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d snippets, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("snippet %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestExtractRefuses(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ page, why string }{
		"a marker before a shell fence": {md("<!-- snippet: func() -->", "sh", "ls"), "right before a ```go fence"},
		"a marker far from its fence":   {"<!-- snippet: func() -->\n\n" + fence + "go\nx := 1\n" + fence + "\n", "right before a ```go fence"},
		"an unknown marker":             {md("<!-- snippet: main -->", "go", "x := 1"), `snippet marker "main"`},
		"a marker on a whole file":      {md("<!-- snippet: declarations -->", "go", "package p"), "takes no snippet marker"},
		"an unclosed fence":             {"text\n" + fence + "go\nx := 1\n", "p.md:2: the fence opened here is never closed"},
	} {
		if _, err := readmetest.Extract("p.md", []byte(c.page)); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: got %v, want an error saying %q", name, err, c.why)
		}
	}
}

// TestCheck runs the compiler and the error rules over one page per case,
// all in one Check (each loads the snippets' packages once).
func TestCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the snippets' dependencies: not in -short")
	}
	t.Parallel()
	ok := map[string]string{
		"a body that checks its error": md("<!-- snippet: func(ctx context.Context) error -->", "go",
			"req, err := http.NewRequestWithContext(ctx, \"GET\", \"/\", nil)\nif err != nil {\n\treturn err\n}\n_ = req.URL"),
		"an error-free handler": md("<!-- snippet: func(w http.ResponseWriter, r *http.Request) -->", "go",
			"tx, _ := idempotency.TxFromContext(r.Context()) // a bool, not an error\n_ = tx\nw.WriteHeader(http.StatusCreated)"),
		"excluded calls and a defer": md("", "go",
			"fmt.Println(\"x\")\nvar b strings.Builder\nb.WriteString(\"x\")\nf, err := os.Open(\"x\")\nif err != nil {\n\treturn\n}\ndefer f.Close()"),
		"declarations": md("<!-- snippet: declarations -->", "go",
			"func teapot(w http.ResponseWriter, r *http.Request) {\n\thttp.Error(w, \"no\", http.StatusTeapot)\n}"),
		"an import goimports must find": md("<!-- snippet: func(n int) string -->", "go", "return strconv.Itoa(n) + url.PathEscape(\"a b\")"),
		"a whole file":                  md("", "go", "package main\n\nimport \"os\"\n\nfunc main() { os.Exit(0) }"),
		"not go":                        md("", "sh", "go run ./... && {"),
		"an error re-read":              md("", "go", "err := os.Remove(\"a\")\nerr = errors.Join(err, os.Remove(\"b\"))\nif err != nil {\n\tpanic(err)\n}"),
	}
	// want: the problem's position and text, after "FILE:".
	bad := []struct{ name, page, want string }{
		{"a call as a statement", md("", "go", "os.Remove(\"x\")"),
			"5:1: the error os.Remove returns is dropped"},
		{"an error assigned to _", md("", "go", "f, _ := os.Open(\"x\")\n_ = f.Name()"),
			"5:4: an error is assigned to _"},
		{"a single error to _", md("", "go", "x := 1\n_ = os.Remove(\"x\")\n_ = x"),
			"6:1: an error is assigned to _"},
		{"an error overwritten", md("", "go", "a, err := os.Open(\"a\")\nb, err := os.Open(\"b\")\nif err != nil {\n\treturn\n}\n_, _ = a.Name(), b.Name()"),
			"5:4: the error assigned to err here is overwritten at line 6 before it is checked"},
		{"a func literal is no http.Handler", md("<!-- snippet: func(mux *http.ServeMux) -->", "go", "mux.Handle(\"/\", func(w http.ResponseWriter, r *http.Request) {})"),
			"5:17: cannot use (func"},
		{"prose in code", md("", "go", "if err := os.Remove(\"x\"); err != nil { ... }"),
			"5:40: expected statement, found '...'"},
		{"a missing import in a file", md("", "go", "package main\n\nfunc main() { fmt.Println() }"),
			"7:15: undefined: fmt"},
		{"a bad marker", md("<!-- snippet: func(x -->", "go", "x := 1"),
			"5: snippet marker \"func(x\" is not a function's signature"},
	}
	var all []readmetest.Snippet
	add := func(file, page string) {
		s, err := readmetest.Extract(file, []byte(page))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s...)
	}
	names := map[string]string{}
	for name, page := range ok {
		file := fmt.Sprintf("ok%d.md", len(names))
		names[file] = name
		add(file, page)
	}
	for i, c := range bad {
		bad[i].want = fmt.Sprintf("bad%d.md:%s", i, c.want)
		add(fmt.Sprintf("bad%d.md", i), c.page)
	}
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	problems, err := readmetest.Check(dir, all)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, p := range problems {
		file, _, _ := strings.Cut(p, ":")
		if strings.HasPrefix(file, "ok") {
			t.Errorf("%s: %s", names[file], p)
		}
		for _, c := range bad {
			if strings.HasPrefix(p, c.want) {
				found[c.want] = true
			}
		}
	}
	for _, c := range bad {
		if !found[c.want] {
			t.Errorf("%s: no problem starting %q among:\n%s", c.name, c.want, strings.Join(problems, "\n"))
		}
	}
}
