package idempotency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// TestTxLockWaitBelowStoreTimeout: a transactional route refuses, at
// construction, a TxLockWait that the claim's tries (each may wait it
// out once, rounded up to the millisecond PostgreSQL counts) could spend
// past the store timeout: its duplicates would get 503 instead of 409.
func TestTxLockWaitBelowStoreTimeout(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(beginFails{idempotency.NewMemoryStore()}, idempotency.Config{StoreTimeout: time.Second, Lease: 10 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		wait          time.Duration
		transactional bool
		ok            bool
	}{
		{0, true, true}, // DefaultTxLockWait
		{199 * time.Millisecond, true, true},
		{199*time.Millisecond + time.Microsecond, true, false}, // 200ms as PostgreSQL counts it
		{200 * time.Millisecond, true, false},
		{time.Second, true, false},
		{time.Minute, true, false},
		{time.Minute, false, true}, // not a transactional route: unused
	} {
		_, err := mw.Route(idempotency.RouteConfig{Name: "orders", Transactional: c.transactional, TxLockWait: c.wait})
		if c.ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "RouteConfig.TxLockWait") {
			t.Errorf("TxLockWait %v (transactional %v) under a 1s store timeout: %v, want accepted %v (an error naming RouteConfig.TxLockWait)",
				c.wait, c.transactional, err, c.ok)
		}
	}
}
