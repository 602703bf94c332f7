package readmetest

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/imports"
)

// unit is one snippet made into a Go file.
type unit struct {
	s    Snippet
	file *ast.File
}

// Check compiles each snippet as a package of its own, in the module at
// dir (which must require every package the snippets import), and returns
// one line per problem, each starting with the Markdown file and line it
// is about. The error is about the check itself (go list failed).
func Check(dir string, snippets []Snippet) ([]string, error) {
	fset := token.NewFileSet()
	var problems []string
	var units []unit
	for _, s := range snippets {
		src, err := source(dir, s)
		var f *ast.File
		if err == nil {
			// A file name without a directory: the //line directives'
			// names then stay as relative as the Markdown file's.
			f, err = parser.ParseFile(fset, "snippet.go", src, parser.ParseComments|parser.AllErrors)
		}
		if err != nil {
			problems = append(problems, syntaxProblems(s, err)...)
			continue
		}
		units = append(units, unit{s, f})
	}
	pkgs, missing, err := load(dir, units)
	if err != nil {
		return nil, err
	}
	for _, u := range units {
		problems = append(problems, typeCheck(fset, u, pkgs, missing)...)
	}
	return problems, nil
}

// source returns the snippet as a file, with //line directives that put
// every position at its place in the Markdown file.
func source(dir string, s Snippet) (string, error) {
	const head = "package snippet\n\n"
	body, err := wrap(s)
	if err != nil || s.Kind == File {
		return body, err
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "snippet.go", head+body, parser.AllErrors); err != nil {
		return "", err // positioned in the Markdown by the //line directives
	}
	imp, err := importsOf(dir, head+body)
	return head + imp + body, err
}

// wrap returns the snippet's code in its function (a Body) and behind
// //line directives.
func wrap(s Snippet) (string, error) {
	at := func(line int) string { return fmt.Sprintf("//line %s:%d:1\n", s.File, line) }
	if s.Kind != Body {
		return at(s.Line) + s.Code, nil
	}
	sig, err := parser.ParseExpr(s.Signature)
	ft, ok := sig.(*ast.FuncType)
	if err != nil || !ok {
		return "", fmt.Errorf("snippet marker %q is not a function's signature (%v)", s.Signature, err)
	}
	rest := ""
	if ft.Results != nil {
		rest = "panic(\"the rest of the function\")\n" // the snippet need not end in a return
	}
	return at(s.Line-1) + "func snippet" + strings.TrimPrefix(s.Signature, "func") + " {\n" + at(s.Line) + s.Code + rest + "}\n", nil
}

// known are import bindings offered to goimports with every snippet: it
// drops those a snippet does not use, and searches the module graph (about
// a second per snippet) only for a name none of them binds. They bind this
// repository's packages whose name is not their directory's, which it does
// not find by name, and the usual ones. A name two packages share (chi's
// and echo's middleware) is left to its search, which looks at what the
// snippet uses of it.
const known = `import (
	bytes "bytes"
	context "context"
	errors "errors"
	fmt "fmt"
	io "io"
	log "log"
	slog "log/slog"
	http "net/http"
	os "os"
	strings "strings"
	time "time"

	connect "connectrpc.com/connect"
	chi "github.com/go-chi/chi/v5"
	gin "github.com/gin-gonic/gin"
	handlers "github.com/gorilla/handlers"
	mux "github.com/gorilla/mux"
	pgx "github.com/jackc/pgx/v5"
	pgxpool "github.com/jackc/pgx/v5/pgxpool"
	echo "github.com/labstack/echo/v4"
	prometheus "github.com/prometheus/client_golang/prometheus"
	otelhttp "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metric "go.opentelemetry.io/otel/metric"
	grpc "google.golang.org/grpc"
	insecure "google.golang.org/grpc/credentials/insecure"
	structpb "google.golang.org/protobuf/types/known/structpb"

	idempotency "github.com/idemkit/idempotency"
	idemchi "github.com/idemkit/idempotency/contrib/chi"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	idemecho "github.com/idemkit/idempotency/contrib/echo"
	idemgin "github.com/idemkit/idempotency/contrib/gin"
	idemgorilla "github.com/idemkit/idempotency/contrib/gorilla"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	idemotel "github.com/idemkit/idempotency/contrib/otel"
	idemclient "github.com/idemkit/idempotency/idemclient"
	migrations "github.com/idemkit/idempotency/migrations"
)

`

// importsOf returns the import declarations goimports gives src (a file
// without imports), resolved in the module at dir.
func importsOf(dir, src string) (string, error) {
	head, rest, _ := strings.Cut(src, "\n\n")
	out, err := imports.Process(filepath.Join(dir, "snippet.go"), []byte(head+"\n\n"+known+rest), nil)
	if err != nil {
		return "", err
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", out, parser.ImportsOnly)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, spec := range f.Imports {
		if spec.Name != nil && spec.Name.Name != path.Base(strings.Trim(spec.Path.Value, `"`)) {
			b.WriteString("import " + spec.Name.Name + " " + spec.Path.Value + "\n")
			continue
		}
		b.WriteString("import " + spec.Path.Value + "\n")
	}
	return b.String() + "\n", nil
}

// syntaxProblems lists the parse errors of a snippet.
func syntaxProblems(s Snippet, err error) []string {
	var list scanner.ErrorList
	if errors.As(err, &list) {
		out := make([]string, 0, len(list))
		for _, e := range list {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{fmt.Sprintf("%s: %v", s.Where(), err)}
}

// load type-loads (from export data) every package the units import, and
// returns them by path, and the import paths that could not be loaded, with
// why. The packages share their dependencies' types (go/packages loads them
// in one view), so an http.Handler is one type across snippets.
func load(dir string, units []unit) (map[string]*types.Package, map[string]string, error) {
	paths := map[string]bool{}
	for _, u := range units {
		for _, spec := range u.file.Imports {
			paths[strings.Trim(spec.Path.Value, `"`)] = true
		}
	}
	list := make([]string, 0, len(paths))
	for p := range paths {
		list = append(list, p)
	}
	sort.Strings(list)
	pkgs := map[string]*types.Package{}
	missing := map[string]string{}
	if len(list) == 0 {
		return pkgs, missing, nil
	}
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: dir}
	roots, err := packages.Load(cfg, list...)
	if err != nil {
		return nil, nil, fmt.Errorf("go list in %s: %w", dir, err)
	}
	for _, r := range roots {
		switch {
		case len(r.Errors) > 0:
			missing[r.PkgPath] = r.Errors[0].Msg
		case r.Types != nil:
			pkgs[r.PkgPath] = r.Types
		}
	}
	return pkgs, missing, nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// typeCheck type-checks one unit and looks for dropped errors.
func typeCheck(fset *token.FileSet, u unit, pkgs map[string]*types.Package, missing map[string]string) []string {
	var problems []string
	conf := types.Config{
		Importer: importerFunc(func(path string) (*types.Package, error) {
			if p := pkgs[path]; p != nil {
				return p, nil
			}
			if why := missing[path]; why != "" {
				return nil, fmt.Errorf("%s (a package a snippet uses must be imported by deps_test.go, so that go.mod requires it): %s", path, why)
			}
			return nil, fmt.Errorf("%s was not loaded", path)
		}),
		Error: func(err error) { problems = append(problems, err.Error()) },
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	if _, err := conf.Check("snippet", fset, []*ast.File{u.file}, info); err != nil && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%s: %v", u.s.Where(), err))
	}
	if len(problems) > 0 {
		return problems
	}
	return droppedErrors(fset, u.file, info)
}
