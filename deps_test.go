package idempotency_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// heavyModules are the import path prefixes a consumer of the root package
// must not get: golang-migrate (the migrations package's), testcontainers
// and the OpenTelemetry modules the Docker client pulls in (the nested
// module internal/testdb/pgcontainer's), routers (contrib/*'s) and the
// broker client (the nested module examples/consumer's).
var heavyModules = []string{
	"github.com/golang-migrate/",
	"github.com/testcontainers/",
	"go.opentelemetry.io/",
	"github.com/labstack/echo",
	"github.com/gin-gonic/",
	"github.com/go-chi/",
	"github.com/gorilla/",
	"github.com/nats-io/",
}

// TestRootPackageStaysLean pins the promise that a program importing only
// the root package never builds golang-migrate, testcontainers, a framework
// or a broker client: those live in the migrations package, the tests,
// contrib/ and examples/consumer.
func TestRootPackageStaysLean(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range heavyModules {
			if strings.HasPrefix(pkg, heavy) {
				t.Errorf("the root package depends on %s", pkg)
			}
		}
	}
}

// TestRootGoModStaysLean pins that the root module's go.mod requires no
// testcontainers, OpenTelemetry, router or broker module, not even as
// indirect: a consumer's module graph (go list -m all) holds every module
// the root go.mod lists. golang-migrate is required, by the migrations package.
func TestRootGoModStaysLean(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := exec.Command("go", "mod", "edit", "-json").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod edit -json: %v\n%s", err, out)
	}
	if mod.Module.Path != "github.com/idemkit/idempotency" || len(mod.Require) == 0 {
		t.Fatalf("read module %q with %d requirements: not the root go.mod", mod.Module.Path, len(mod.Require))
	}
	for _, r := range mod.Require {
		for _, heavy := range heavyModules {
			if heavy != "github.com/golang-migrate/" && strings.HasPrefix(r.Path, heavy) {
				t.Errorf("the root go.mod requires %s", r.Path)
			}
		}
	}
}

// TestOnlyStoreFilesImportPgx pins the pgx store's boundary inside the
// root package: only store_pg*.go files import github.com/jackc/pgx, and
// there are at most 8 of them, so the driver stays behind a visible file
// prefix (store_pg.go its face) and the engine never depends on it.
func TestOnlyStoreFilesImportPgx(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	store := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		if strings.HasPrefix(name, "store_pg") {
			store++
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "github.com/jackc/pgx") && !strings.HasPrefix(name, "store_pg") {
				t.Errorf("%s imports %s: only the store_pg*.go files may", name, path)
			}
		}
	}
	if store == 0 || store > 9 {
		t.Errorf("%d store_pg*.go files, want 1 to 9", store)
	}
}
