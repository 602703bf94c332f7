package idempotency_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestMain checks that no test leaves a goroutine behind, and stops the
// Postgres container testdb may have started. The one goroutine the
// middleware leaves on purpose is giveBackRetrying's: it gives back the key
// of a claim whose outcome is unknown, bounded by the lease, and may
// outlive the test whose store failed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m), goleak.IgnoreAnyFunction("github.com/idemkit/idempotency.(*Middleware).giveBackRetrying"))
}
