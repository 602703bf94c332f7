package readmetest

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// Link is one relative link of a Markdown file: [text](Path#Anchor).
type Link struct {
	Line   int    // 1-based
	Path   string // relative to the Markdown file's directory; "" for the file itself
	Anchor string // without the '#'; "" for none
}

var (
	// linkRE matches an inline link or image target, [text](target "title").
	linkRE = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refRE matches a reference definition, [name]: target.
	refRE    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	codeRE   = regexp.MustCompile("`+[^`]*`+")
	headRE   = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	anchorRE = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// inlineLinkRE is a link inside a heading: its text stays.
	inlineLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	schemeRE     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// Links returns the relative links of a Markdown file, past fenced code
// and inline code spans. A link with a scheme (https:, mailto:) is left
// out: it is not this repository's to check.
func Links(md []byte) []Link {
	var out []Link
	forText(md, func(n int, line string) {
		line = codeRE.ReplaceAllString(line, "")
		var targets []string
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refRE.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			if t == "" || schemeRE.MatchString(t) || strings.HasPrefix(t, "//") {
				continue
			}
			p, a, _ := strings.Cut(t, "#")
			out = append(out, Link{Line: n, Path: p, Anchor: a})
		}
	})
	return out
}

// Anchors returns the anchors a Markdown file offers on GitHub: one per
// heading, as GitHub makes them (lower case, punctuation dropped, spaces
// made hyphens, a repeated one numbered -1, -2, ...), and each explicit
// <a id="..."> or <a name="...">.
func Anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	forText(md, func(_ int, line string) {
		for _, m := range anchorRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		h := headRE.FindStringSubmatch(line)
		if h == nil {
			return
		}
		slug := Slug(h[2])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	})
	return out
}

// Slug is the anchor GitHub gives a heading's text.
func Slug(heading string) string {
	heading = inlineLinkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// forText calls f with each line (1-based) outside fenced code blocks.
func forText(md []byte, f func(n int, line string)) {
	lines := strings.Split(strings.ReplaceAll(string(md), "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		if m := fenceRE.FindStringSubmatch(lines[i]); m != nil {
			if end := closing(lines, i+1, m[2]); end >= 0 {
				i = end
				continue
			}
		}
		f(i+1, lines[i])
	}
}
