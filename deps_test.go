package idempotency_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRootPackageStaysLean pins the promise that a program importing only
// the root package never builds golang-migrate, testcontainers or a
// framework: those live in the migrations package, the tests and contrib/.
func TestRootPackageStaysLean(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range []string{
			"github.com/golang-migrate/",
			"github.com/testcontainers/",
			"go.opentelemetry.io/",
			"github.com/labstack/echo",
			"github.com/gin-gonic/",
			"github.com/go-chi/",
			"github.com/gorilla/",
		} {
			if strings.HasPrefix(pkg, heavy) {
				t.Errorf("the root package depends on %s", pkg)
			}
		}
	}
}
