package idempotency

import (
	"strings"
	"testing"
)

// A small SQL tokenizer for the Citus rules (store_pg_pool_statements_test.go). It is
// not a parser: it knows words, parameters, literals, quoted identifiers,
// comments and parentheses, which is what the rules need to tell a
// RETURNING list from the outer SELECT of a CTE, a subquery from the
// statement around it, and a function name inside a string from a call.

type sqlTokKind int

const (
	tokWord   sqlTokKind = iota // keyword or identifier, lower-cased
	tokParam                    // $1
	tokString                   // '...', E'...', $$...$$: text holds the value
	tokIdent                    // "quoted identifier": text holds the name
	tokNumber
	tokPunct // ( ) , ; . :: = < > and the like
)

// sqlTok is one token and the parenthesis depth it stands at (a "(" and
// its ")" both at the depth outside them).
type sqlTok struct {
	kind  sqlTokKind
	text  string
	depth int
}

// is reports a word or punctuation equal to s (lower case).
func (t sqlTok) is(s string) bool { return (t.kind == tokWord || t.kind == tokPunct) && t.text == s }

// sqlTokens splits sql into tokens, dropping comments and white space.
func sqlTokens(sql string) []sqlTok {
	var out []sqlTok
	depth := 0
	emit := func(k sqlTokKind, text string) {
		d := depth
		if k == tokPunct && text == ")" {
			depth--
			d = depth
		}
		out = append(out, sqlTok{kind: k, text: text, depth: d})
		if k == tokPunct && text == "(" {
			depth++
		}
	}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				return out
			}
			i += 2 + end + 2
		case c == '\'':
			j := i + 1
			var b strings.Builder
			for j < len(sql) {
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						b.WriteByte('\'')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(sql[j])
				j++
			}
			emit(tokString, b.String())
			i = j + 1
		case c == '"':
			j := i + 1
			for j < len(sql) && sql[j] != '"' {
				j++
			}
			emit(tokIdent, sql[i+1:min(j, len(sql))])
			i = j + 1
		case c == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9':
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			emit(tokParam, sql[i:j])
			i = j
		case c == '$':
			// A dollar quote, $$...$$ or $tag$...$tag$.
			end := strings.IndexByte(sql[i+1:], '$')
			if end < 0 {
				return out
			}
			tag := sql[i : i+1+end+1]
			body := sql[i+len(tag):]
			stop := strings.Index(body, tag)
			if stop < 0 {
				return out
			}
			emit(tokString, body[:stop])
			i += len(tag) + stop + len(tag)
		case isWordByte(c) && (c < '0' || c > '9'):
			j := i
			for j < len(sql) && (isWordByte(sql[j]) || sql[j] == '$') {
				j++
			}
			word := strings.ToLower(sql[i:j])
			if (word == "e" || word == "x" || word == "b") && j < len(sql) && sql[j] == '\'' {
				i = j // a prefixed literal: the literal follows
				continue
			}
			emit(tokWord, word)
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(sql) && (sql[j] >= '0' && sql[j] <= '9' || sql[j] == '.') {
				j++
			}
			emit(tokNumber, sql[i:j])
			i = j
		default:
			op := punct(sql[i:])
			emit(tokPunct, op)
			i += len(op)
		}
	}
	return out
}

// punct returns the operator or punctuation s starts with.
func punct(s string) string {
	for _, op := range []string{"::", "<=", ">=", "<>", "!="} {
		if strings.HasPrefix(s, op) {
			return op
		}
	}
	return s[:1]
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// clauseEnd returns the index just past the clause that starts at
// toks[from]: the tokens at toks[from]'s depth or deeper, up to the ")"
// that closes the parenthesis it stands in or a ";" at its depth.
func clauseEnd(toks []sqlTok, from int) int {
	d := toks[from].depth
	for i := from; i < len(toks); i++ {
		if toks[i].depth < d || toks[i].depth == d && toks[i].is(";") {
			return i
		}
	}
	return len(toks)
}

// subquery reports whether toks[i] opens a parenthesised SELECT or WITH.
func subquery(toks []sqlTok, i int) bool {
	return toks[i].is("(") && i+1 < len(toks) && (toks[i+1].is("select") || toks[i+1].is("with"))
}

// skipGroup returns the index of the ")" that closes the "(" at toks[i].
func skipGroup(toks []sqlTok, i int) int {
	d := toks[i].depth
	for j := i + 1; j < len(toks); j++ {
		if toks[j].is(")") && toks[j].depth == d {
			return j
		}
	}
	return len(toks) - 1
}

// TestSQLTokens: literals, comments, quoted identifiers and dollar quotes
// hide what they hold, and depth follows the parentheses.
func TestSQLTokens(t *testing.T) {
	toks := sqlTokens(`WITH x AS (SELECT 'now()' -- now()
		/* now() */, "now()", $$ now() $$, $1::int, E'it''s') SELECT 1`)
	var words []string
	for _, tk := range toks {
		if tk.kind == tokWord {
			words = append(words, tk.text)
		}
	}
	if got := strings.Join(words, " "); got != "with x as select int select" {
		t.Errorf("words %q", got)
	}
	var strs []string
	for _, tk := range toks {
		if tk.kind == tokString || tk.kind == tokIdent {
			strs = append(strs, tk.text)
		}
	}
	if got := strings.Join(strs, "|"); got != "now()|now()| now() |it's" {
		t.Errorf("strings %q", got)
	}
	if last := toks[len(toks)-1]; last.text != "1" || last.depth != 0 {
		t.Errorf("last token %+v, want 1 at depth 0", last)
	}
}
