package idemconnect_test

import (
	"testing"

	"github.com/idemkit/idempotency/internal/testdb"
)

// TestMain stops the Postgres container testdb may have started.
func TestMain(m *testing.M) { testdb.Main(m).Run() }
