package idempotencytest_test

import (
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
)

// A store author runs the suite from a test of their own, with a fresh,
// empty store per subtest. Here the memory store stands in for it; a
// database-backed store would create an isolated schema in newStore and
// drop it with t.Cleanup.
func ExampleRun() {
	testMyStore := func(t *testing.T) {
		idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
			return idempotency.NewMemoryStore()
		})
	}
	_ = testMyStore // func TestMyStore(t *testing.T) { ... } in your store's package
}
