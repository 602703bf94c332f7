package readmetest

import (
	"fmt"
	"regexp"
	"strings"
)

// Kind is how a snippet is compiled.
type Kind int

// The kinds of snippet (see the package documentation).
const (
	Body         Kind = iota // a function body: Signature names the function
	Declarations             // top-level declarations without a package clause
	File                     // a whole file, package clause and imports included
)

// Snippet is one Go fence of a Markdown file.
type Snippet struct {
	File      string // the Markdown file, as given to Extract
	Line      int    // the line of the snippet's first line of code (1-based)
	Kind      Kind
	Signature string // a Body's function, "func(...) ..."; "func()" by default
	Code      string // the fence's content, its indentation removed
}

// Where names the snippet for a reader: FILE:LINE.
func (s Snippet) Where() string { return fmt.Sprintf("%s:%d", s.File, s.Line) }

var (
	markerRE = regexp.MustCompile(`^<!--\s*snippet:\s*(.*?)\s*-->$`)
	fenceRE  = regexp.MustCompile("^(\\s*)(```+|~~~+)\\s*([^\\s`]*)")
)

// Extract returns the Go snippets of one Markdown file. A fence of another
// language is skipped. A snippet marker that does not stand right before a
// Go fence, a bad marker and an unclosed fence are errors: a snippet must
// never go unchecked by mistake.
func Extract(file string, md []byte) ([]Snippet, error) {
	lines := strings.Split(strings.ReplaceAll(string(md), "\r\n", "\n"), "\n")
	var out []Snippet
	for i := 0; i < len(lines); i++ {
		if m := markerRE.FindStringSubmatch(strings.TrimSpace(lines[i])); m != nil {
			if i+1 >= len(lines) || !isGoFence(lines[i+1]) {
				return nil, fmt.Errorf("%s:%d: a snippet marker must stand on the line right before a ```go fence", file, i+1)
			}
			continue
		}
		f := fenceRE.FindStringSubmatch(lines[i])
		if f == nil {
			continue
		}
		indent, fence, lang := f[1], f[2], f[3]
		end := closing(lines, i+1, fence)
		if end < 0 {
			return nil, fmt.Errorf("%s:%d: the fence opened here is never closed", file, i+1)
		}
		if isGo(lang) {
			s, err := snippet(file, lines, i, end, indent)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		i = end
	}
	return out, nil
}

// snippet builds the snippet of the fence that opens on line open and
// closes on line end (0-based).
func snippet(file string, lines []string, open, end int, indent string) (Snippet, error) {
	body := make([]string, 0, end-open-1)
	for _, l := range lines[open+1 : end] {
		body = append(body, strings.TrimPrefix(l, indent))
	}
	s := Snippet{File: file, Line: open + 2, Kind: Body, Signature: "func()", Code: strings.Join(body, "\n") + "\n"}
	marker := ""
	if open > 0 {
		if m := markerRE.FindStringSubmatch(strings.TrimSpace(lines[open-1])); m != nil {
			marker = m[1]
		}
	}
	switch {
	case startsWithPackage(s.Code):
		if marker != "" {
			return s, fmt.Errorf("%s:%d: a whole file (it has a package clause) takes no snippet marker", file, open)
		}
		s.Kind = File
	case marker == "declarations":
		s.Kind = Declarations
	case strings.HasPrefix(marker, "func("):
		s.Signature = marker
	case marker != "":
		return s, fmt.Errorf("%s:%d: snippet marker %q: want \"declarations\" or a function's signature, func(...)", file, open, marker)
	}
	return s, nil
}

// closing returns the line (0-based) that closes a fence opened with fence,
// searching from line from, or -1.
func closing(lines []string, from int, fence string) int {
	for j := from; j < len(lines); j++ {
		t := strings.TrimSpace(lines[j])
		if strings.HasPrefix(t, fence[:3]) && strings.Trim(t, fence[:1]) == "" && len(t) >= len(fence) {
			return j
		}
	}
	return -1
}

func isGo(lang string) bool { return lang == "go" || lang == "golang" }

func isGoFence(line string) bool {
	f := fenceRE.FindStringSubmatch(line)
	return f != nil && isGo(f[3])
}

// startsWithPackage reports whether the first line of code (past blank
// lines and // comments) is a package clause.
func startsWithPackage(code string) bool {
	for _, l := range strings.Split(code, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "//") {
			continue
		}
		return strings.HasPrefix(t, "package ")
	}
	return false
}
