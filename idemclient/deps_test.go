package idemclient

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandardLibraryOnly: the package imports nothing but the standard
// library, and its tests only goleak besides, so that a program importing
// idemclient builds and downloads none of the middleware's dependencies
// (its go.sum gains goleak's checksum, nothing else).
func TestStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", "-test", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, _, _ := strings.Cut(line, " ") // "p [p.test]" for a test's variant
		switch {
		case strings.HasPrefix(pkg, "github.com/idemkit/idempotency/idemclient"),
			strings.HasPrefix(pkg, "go.uber.org/goleak"):
		default:
			t.Errorf("idemclient or its tests import %s", pkg)
		}
	}
}
