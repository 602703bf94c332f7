package idempotency_test

import (
	"encoding/json"
	"os/exec"
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
