package idemconnect_test

import (
	"os"
	"testing"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestMain runs a child server when the test binary is started as one
// (serveChild), and otherwise the tests, stopping the Postgres container
// testdb may have started.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(envChildDSN); dsn != "" {
		serveChild(dsn, os.Getenv(envChildBlock) == "1")
		return
	}
	os.Exit(testdb.Main(m).Run())
}
