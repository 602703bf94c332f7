package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

var errPart = errors.New("part called")

// partStore is a Store whose ReleaseOwner and Check answer errPart, so a
// test sees whether a call through a wrapper reached it.
type partStore struct{ idempotency.Store }

func (partStore) ReleaseOwner(context.Context, idempotency.ClaimRequest) (bool, error) {
	return false, errPart
}

func (partStore) Check(context.Context) error { return errPart }

// txPartStore is a partStore that is a TxStore, with a lock-wait budget
// of budget.
type txPartStore struct {
	partStore
	budget time.Duration
}

func (txPartStore) BeginClaim(context.Context, *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.ClaimResult, error) {
	return nil, idempotency.ClaimResult{}, errPart
}

func (s txPartStore) TxLockWaitBudget(time.Duration) time.Duration { return s.budget }

// has reports whether s is a TxStore.
func has(s idempotency.Store) bool {
	_, tx := s.(idempotency.TxStore)
	return tx
}

// TestSealingStoreInterfaces: a sealing store is a TxStore exactly when
// its inner store is, and each call it delegates (ReleaseOwner, Check,
// BeginClaim) reaches the inner store's method.
func TestSealingStoreInterfaces(t *testing.T) {
	t.Parallel()
	plain := partStore{idempotency.NewMemoryStore()}
	for _, inner := range []idempotency.Store{plain, txPartStore{partStore: plain}} {
		want := has(inner)
		s := sealing(t, inner, sealKeysOf(t, "k1"))
		if got := has(s); got != want {
			t.Errorf("inner %v: sealing store has %v", want, got)
		}
		ctx := t.Context()
		_, err := s.ReleaseOwner(ctx, idempotency.ClaimRequest{})
		calls := []error{err, s.Check(ctx)}
		if ts, ok := s.(idempotency.TxStore); ok {
			_, _, err := ts.BeginClaim(ctx, nil)
			calls = append(calls, err)
		}
		for i, err := range calls {
			if !errors.Is(err, errPart) {
				t.Errorf("inner %v: call %d did not reach the inner store: %v", want, i, err)
			}
		}
	}

	// The stores of this package.
	for name, c := range map[string]struct {
		inner idempotency.Store
		want  bool
	}{
		"memory":   {idempotency.NewMemoryStore(), false},
		"postgres": {idempotency.NewPostgresStore(testdb.New(t)), true},
	} {
		if got := has(c.inner); got != c.want {
			t.Fatalf("%s store: %v, want %v", name, got, c.want)
		}
		if got := has(sealing(t, c.inner, sealKeysOf(t, "k1"))); got != c.want {
			t.Errorf("sealing %s store: %v", name, got)
		}
	}
}

// TestSealingStoreKeepsTheTxLockWaitBudget: the middleware asks a
// transactional store how long its claim may wait on locks; through the
// sealing store it gets the inner store's answer, so a route the inner
// store would refuse is refused, and one it would accept is accepted.
func TestSealingStoreKeepsTheTxLockWaitBudget(t *testing.T) {
	t.Parallel()
	plain := partStore{idempotency.NewMemoryStore()}
	for name, c := range map[string]struct {
		inner   idempotency.Store
		refused bool
	}{
		"an hour's budget":    {txPartStore{plain, time.Hour}, true},
		"a millisecond's one": {txPartStore{plain, time.Millisecond}, false},
	} {
		for _, s := range []idempotency.Store{c.inner, sealing(t, c.inner, sealKeysOf(t, "k1"))} {
			mw, err := idempotency.New(s, idempotency.Config{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = mw.Route(idempotency.RouteConfig{Transactional: true})
			if refused := err != nil; refused != c.refused {
				t.Errorf("%s, store %T: route refused %v (%v), want %v", name, s, refused, err, c.refused)
			}
		}
	}
}
