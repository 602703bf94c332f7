// Package readmetest compiles the Go snippets of the repository's Markdown
// (README.md, docs/*.md, every other .md file) and fails on a snippet that
// does not compile or drops an error, so that what a newcomer copies works
// as written (DESIGN-settled-r3 item 26). It is a module of its own so that
// it may require every contrib module, and the frameworks their snippets
// use, without the root module doing so.
//
// Every ```go (or ```golang) fence is a snippet; there is no way to mark
// one as not compilable: show such text as ```text. A snippet is one of:
//
//   - a whole file: its first line of code is a package clause. It is
//     compiled as written, imports included.
//   - declarations (functions, types, variables), when the line right
//     before the fence is <!-- snippet: declarations -->. A package clause
//     and the imports it needs are added.
//   - a function body, otherwise. The line right before the fence names
//     the function it belongs in, with the names it uses:
//     <!-- snippet: func(ctx context.Context, mux *http.ServeMux) error -->.
//     Without that line it is the body of func(). Imports are added
//     (golang.org/x/tools/imports). When the function has results, the
//     body need not end in a return: the rest of the function is taken to
//     follow.
//
// The HTML comment does not render on GitHub. A snippet "checks its
// errors": a call whose error result is dropped (a call used as a
// statement, an error assigned to _, or an error variable assigned again
// before it is read) fails, except the calls errcheck excludes by default
// (fmt.Print, fmt.Printf, fmt.Println, writes to a bytes.Buffer or a
// strings.Builder) and deferred or go calls (defer resp.Body.Close()).
package readmetest
