package readmetest

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
)

var errorType = types.Universe.Lookup("error").Type()

// droppedErrors returns one line per error result the file drops: a call
// used as a statement, an error assigned to _, and an error variable
// assigned again before it was read.
func droppedErrors(fset *token.FileSet, f *ast.File, info *types.Info) []string {
	var out []string
	report := func(n ast.Node, format string, args ...any) {
		out = append(out, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), fmt.Sprintf(format, args...)))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ExprStmt:
			if call, ok := ast.Unparen(n.X).(*ast.CallExpr); ok && returnsError(info, call) && !excluded(info, call) {
				report(n, "the error %s returns is dropped: check it", types.ExprString(call.Fun))
			}
		case *ast.AssignStmt:
			for _, i := range blankErrors(info, n.Lhs, n.Rhs) {
				report(n.Lhs[i], "an error is assigned to _: check it")
			}
		case *ast.ValueSpec:
			names := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				names[i] = id
			}
			for _, i := range blankErrors(info, names, n.Values) {
				report(n.Names[i], "an error is assigned to _: check it")
			}
		case *ast.BlockStmt:
			overwritten(fset, info, n.List, report)
		case *ast.CaseClause:
			overwritten(fset, info, n.Body, report)
		case *ast.CommClause:
			overwritten(fset, info, n.Body, report)
		}
		return true
	})
	return out
}

func isError(t types.Type) bool { return t != nil && types.Identical(t, errorType) }

// returnsError reports whether call (not a conversion) has an error among
// its results.
func returnsError(info *types.Info, call *ast.CallExpr) bool {
	tv, ok := info.Types[call]
	if !ok || tv.IsType() {
		return false
	}
	if tuple, ok := tv.Type.(*types.Tuple); ok {
		for i := range tuple.Len() {
			if isError(tuple.At(i).Type()) {
				return true
			}
		}
		return false
	}
	return isError(tv.Type)
}

// excluded reports the calls errcheck leaves alone by default: printing to
// standard output, and writes that cannot fail.
func excluded(info *types.Info, call *ast.CallExpr) bool {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return false
	}
	fn, ok := info.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil {
		return false
	}
	switch fn.FullName() {
	case "fmt.Print", "fmt.Printf", "fmt.Println",
		"(*bytes.Buffer).Write", "(*bytes.Buffer).WriteString", "(*bytes.Buffer).WriteByte", "(*bytes.Buffer).WriteRune",
		"(*strings.Builder).Write", "(*strings.Builder).WriteString", "(*strings.Builder).WriteByte", "(*strings.Builder).WriteRune":
		return true
	}
	return false
}

// blankErrors returns the indexes of lhs that are _ and receive an error.
func blankErrors(info *types.Info, lhs, rhs []ast.Expr) []int {
	ts := make([]types.Type, len(lhs))
	switch {
	case len(rhs) == 1 && len(lhs) > 1:
		if tuple, ok := info.TypeOf(rhs[0]).(*types.Tuple); ok && tuple.Len() == len(lhs) {
			for i := range lhs {
				ts[i] = tuple.At(i).Type()
			}
		}
	case len(rhs) == len(lhs):
		for i := range rhs {
			ts[i] = info.TypeOf(rhs[i])
		}
	}
	var out []int
	for i, l := range lhs {
		if id, ok := l.(*ast.Ident); ok && id.Name == "_" && isError(ts[i]) {
			out = append(out, i)
		}
	}
	return out
}

// overwritten reports an error variable assigned in one statement of list
// and assigned again by a later statement of the same list before any
// statement between them (or that one) read it.
func overwritten(fset *token.FileSet, info *types.Info, list []ast.Stmt, report func(ast.Node, string, ...any)) {
	for i, st := range list {
		as, ok := st.(*ast.AssignStmt)
		if !ok {
			continue
		}
		for _, l := range as.Lhs {
			v := errorVar(info, l)
			if v == nil {
				continue
			}
			for _, later := range list[i+1:] {
				reads, writes := mentions(info, later, v)
				if reads {
					break
				}
				if writes {
					report(l, "the error assigned to %s here is overwritten at line %d before it is checked", v.Name(), fset.Position(later.Pos()).Line)
					break
				}
			}
		}
	}
}

func errorVar(info *types.Info, e ast.Expr) *types.Var {
	id, ok := e.(*ast.Ident)
	if !ok || id.Name == "_" {
		return nil
	}
	v, ok := info.ObjectOf(id).(*types.Var)
	if !ok || !isError(v.Type()) {
		return nil
	}
	return v
}

// mentions reports whether st reads v, and whether it assigns to it.
func mentions(info *types.Info, st ast.Stmt, v *types.Var) (reads, writes bool) {
	lhs := map[*ast.Ident]bool{}
	if as, ok := st.(*ast.AssignStmt); ok && (as.Tok == token.ASSIGN || as.Tok == token.DEFINE) {
		for _, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok {
				lhs[id] = true
			}
		}
	}
	ast.Inspect(st, func(n ast.Node) bool {
		id, ok := n.(*ast.Ident)
		if !ok || info.ObjectOf(id) != v {
			return true
		}
		if lhs[id] {
			writes = true
		} else {
			reads = true
		}
		return true
	})
	return reads, writes
}
