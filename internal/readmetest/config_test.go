package readmetest_test

import (
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestConfigTables: every exported field of idempotency.Config and
// idempotency.RouteConfig has its row (| `Field` | default | meaning |) in
// the README or a page of docs/.
func TestConfigTables(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the root package: not in -short")
	}
	t.Parallel()
	pkgs, err := packages.Load(&packages.Config{Mode: packages.NeedName | packages.NeedTypes}, "github.com/idemkit/idempotency")
	if err != nil || len(pkgs) != 1 || len(pkgs[0].Errors) > 0 {
		t.Fatalf("load the root package: %v %v", err, pkgs)
	}
	var text strings.Builder
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, f := range append(pages, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text.Write(b)
	}
	for _, name := range []string{"Config", "RouteConfig"} {
		obj := pkgs[0].Types.Scope().Lookup(name)
		st, ok := obj.Type().Underlying().(*types.Struct)
		if !ok {
			t.Fatalf("idempotency.%s is not a struct", name)
		}
		for f := range st.Fields() {
			if f.Exported() && !strings.Contains(text.String(), "\n| `"+f.Name()+"` |") {
				t.Errorf("idempotency.%s.%s has no row in the README's (or docs/) configuration tables", name, f.Name())
			}
		}
	}
}
