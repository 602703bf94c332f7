package sqlstore_test

import (
	goexec "os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyDatabaseSQL pins that the package imports only the
// standard library, the root package and its internals: the program picks
// and registers the driver (DESIGN-settled-r3 item 11).
func TestImportsOnlyDatabaseSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := goexec.Command("go", "list", "-f", `{{join .Imports " "}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.Contains(imp, ".") && !strings.HasPrefix(imp, "github.com/idemkit/idempotency") {
			t.Errorf("sqlstore imports %s", imp)
		}
	}
}
