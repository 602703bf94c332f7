package idempotency_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestMain checks that no test leaves a goroutine behind, and stops the
// Postgres container testdb may have started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m))
}
