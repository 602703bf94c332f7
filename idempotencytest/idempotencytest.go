// Package idempotencytest is the conformance suite every idempotency.Store
// must pass: the memory store and the Postgres store run the same tests, so
// they keep the same semantics, and a store of your own runs them too:
//
//	func TestMyStore(t *testing.T) {
//		idempotencytest.Run(t, func(t *testing.T) idempotency.Store {
//			return mystore.New(...) // empty, shared with no other test
//		})
//	}
//
// RunTx is the transactional part, for a TxStore: the caller passes a
// function that writes one row through the route's transaction and one
// that counts the committed rows, so the same checks run on any database
// driver.
//
// The suite never assumes the store's clock is the caller's: a key given a
// tiny TTL or lease is polled with Claim until the store itself reports it
// expired or its lease over. It asserts behaviour, never speed. The
// exported helpers (Request, MustClaim, Read, WaitFor, StoreReason) serve
// a store's own further tests.
//
// Import it only from tests: it imports package testing.
package idempotencytest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

const (
	endpoint      = "POST /api/trading/orders"
	otherEndpoint = "POST /api/billing/checkout-sessions"

	longTTL   = time.Hour        // a row that does not expire during a test
	longLease = 30 * time.Second // a lease that does not run out during a test
	tiny      = time.Millisecond // a TTL or lease that runs out almost at once

	// waitBound bounds every poll for expiry or a lease to run out. It is
	// generous on purpose: it only turns a hang into a failure.
	waitBound = 10 * time.Second
	// tolerance is how far a stored duration (expires_at - created_at,
	// locked_until - locked_at) may be from the requested one. A store
	// that computes both ends from one now() is exact.
	tolerance = 100 * time.Millisecond

	racers = 64 // goroutines racing for one key
)

// setupFunc returns a fresh store for a parallel subtest, and its context.
type setupFunc func(t *testing.T) (idempotency.Store, context.Context)

// Run runs the suite against the stores newStore returns, by area: Claim,
// the fenced outcomes (Complete, Fail, Release), owner tokens
// (ClaimRequest.Owner, Store.ReleaseOwner), Renew, Takeover, tombstones
// (ClaimRequest.Grace), maintenance (Cleanup, Erase, ExportScope), the
// outage probe (Probe) and reconcile (Unsettled, Reconcile,
// ReconcileStale). Every subtest runs in parallel
// and calls newStore once, so newStore must return an empty store that
// shares no rows with any other store it returns (for Postgres, its own
// schema or database), and release it with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	setup := func(t *testing.T) (idempotency.Store, context.Context) {
		t.Helper()
		t.Parallel()
		return newStore(t), t.Context()
	}
	runClaim(t, setup)
	runFinish(t, setup)
	runOwner(t, setup)
	runRenew(t, setup)
	runTakeover(t, setup)
	runTombstone(t, setup)
	runMaintenance(t, setup)
	runProbe(t, setup)
	runReconcile(t, setup)
}
