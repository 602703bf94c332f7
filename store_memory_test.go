package idempotency_test

import (
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() })
}
