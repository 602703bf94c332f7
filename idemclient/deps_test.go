package idemclient

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandardLibraryOnly: the package imports nothing but the standard
// library, so that a program importing idemclient builds and downloads
// none of the middleware's dependencies; its tests import only goleak
// besides (its go.sum gains goleak's checksum, nothing else) and the
// repository's lossy proxy, itself standard library only.
func TestStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	for _, c := range []struct {
		args    []string
		allowed []string
	}{
		{[]string{"."}, []string{"github.com/idemkit/idempotency/idemclient"}},
		{[]string{"-test", "."}, []string{"github.com/idemkit/idempotency/idemclient", "go.uber.org/goleak",
			"github.com/idemkit/idempotency/internal/lossyproxy"}},
	} {
		args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, c.args...)
		out, err := exec.Command(goBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	lines:
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, _, _ := strings.Cut(line, " ") // "p [p.test]" for a test's variant
			for _, ok := range c.allowed {
				if strings.HasPrefix(pkg, ok) {
					continue lines
				}
			}
			t.Errorf("go %s: idemclient imports %s", strings.Join(args, " "), pkg)
		}
	}
}
