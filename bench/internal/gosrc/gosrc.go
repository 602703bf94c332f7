// Package gosrc reads values out of Go source files without building them:
// the bench tools take the library's SQL from internal/pgsql/pgsql.go this
// way (store_pg_sql.go and store_pg_tx_sql.go in revisions before it), so
// they follow it.
package gosrc

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
)

// StringConsts evaluates the string constants of the files (one package's:
// a constant may use another file's) made of literals and other constants
// joined with +.
func StringConsts(paths ...string) (map[string]string, error) {
	var decls []ast.Decl
	for _, path := range paths {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return nil, err
		}
		decls = append(decls, f.Decls...)
	}
	exprs := map[string]ast.Expr{}
	for _, d := range decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					exprs[name.Name] = vs.Values[i]
				}
			}
		}
	}
	out := map[string]string{}
	var eval func(e ast.Expr, depth int) (string, error)
	eval = func(e ast.Expr, depth int) (string, error) {
		if depth > 20 {
			return "", errors.New("constant nesting too deep")
		}
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", errors.New("not a string")
			}
			return strconv.Unquote(e.Value)
		case *ast.Ident:
			x, ok := exprs[e.Name]
			if !ok {
				return "", fmt.Errorf("unknown constant %s", e.Name)
			}
			return eval(x, depth+1)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", errors.New("not a concatenation")
			}
			l, err := eval(e.X, depth+1)
			if err != nil {
				return "", err
			}
			r, err := eval(e.Y, depth+1)
			return l + r, err
		case *ast.ParenExpr:
			return eval(e.X, depth+1)
		}
		return "", errors.New("not a string constant")
	}
	for name, e := range exprs {
		if s, err := eval(e, 0); err == nil {
			out[name] = s
		}
	}
	// internal/pgsql names a statement ClaimSQL where the root package
	// named it pgClaimSQL: both names read it, in every revision.
	for name, s := range out {
		if ast.IsExported(name) {
			if _, ok := out["pg"+name]; !ok {
				out["pg"+name] = s
			}
		}
	}
	return out, nil
}

// PostgresStatements evaluates the string constants of the pgx store's
// statements in the repository (or revision) at dir: internal/pgsql/pgsql.go,
// or store_pg_sql.go and store_pg_tx_sql.go in revisions before it.
func PostgresStatements(dir string) (map[string]string, error) {
	shared := filepath.Join(dir, "internal", "pgsql", "pgsql.go")
	if _, err := os.Stat(shared); err == nil {
		return StringConsts(shared)
	}
	return StringConsts(filepath.Join(dir, "store_pg_sql.go"), filepath.Join(dir, "store_pg_tx_sql.go"))
}
