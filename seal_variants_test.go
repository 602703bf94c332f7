package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/operator"
	"github.com/idemkit/idempotency/internal/testdb"
)

// The optional interfaces the middleware looks for, one method set each.
type (
	txPart    struct{}
	ownerPart struct{}
	checkPart struct{}
)

var errPart = errors.New("part called")

func (txPart) BeginClaim(context.Context, *idempotency.ClaimRequest) (idempotency.RouteTx, idempotency.ClaimResult, error) {
	return nil, idempotency.ClaimResult{}, errPart
}

func (ownerPart) ReleaseOwner(context.Context, idempotency.ClaimRequest) (bool, error) {
	return false, errPart
}

func (checkPart) Check(context.Context) error { return errPart }

type checker interface{ Check(context.Context) error }

// has reports which optional interfaces s implements, in the order
// TxStore, OwnerReleaser, Check, and whether the CLI's operator access
// (internal/operator) resolves it.
func has(s idempotency.Store) [4]bool {
	_, tx := s.(idempotency.TxStore)
	_, owner := s.(idempotency.OwnerReleaser)
	_, check := s.(checker)
	_, ops := operator.For[idempotency.Record, idempotency.Fence](s)
	return [4]bool{tx, owner, check, ops}
}

// TestSealingStoreInterfaces: a sealing store implements exactly the
// optional interfaces its inner store implements, for every combination,
// and each one reaches the inner store's method; the operator access
// resolves through it exactly when it resolves its inner store.
func TestSealingStoreInterfaces(t *testing.T) {
	t.Parallel()
	var base struct{ idempotency.Store }
	base.Store = idempotency.NewMemoryStore()
	type S = idempotency.Store
	inners := []idempotency.Store{
		base,
		struct {
			S
			txPart
		}{base, txPart{}},
		struct {
			S
			ownerPart
		}{base, ownerPart{}},
		struct {
			S
			txPart
			ownerPart
		}{base, txPart{}, ownerPart{}},
		struct {
			S
			checkPart
		}{base, checkPart{}},
		struct {
			S
			txPart
			checkPart
		}{base, txPart{}, checkPart{}},
		struct {
			S
			ownerPart
			checkPart
		}{base, ownerPart{}, checkPart{}},
		struct {
			S
			txPart
			ownerPart
			checkPart
		}{base, txPart{}, ownerPart{}, checkPart{}},
	}
	seen := map[[4]bool]bool{}
	for _, inner := range inners {
		want := has(inner)
		seen[want] = true
		s := sealing(t, inner, sealKeysOf(t, "k1"))
		if got := has(s); got != want {
			t.Errorf("inner %v: sealing store has %v", want, got)
		}
		ctx := t.Context()
		calls := []error{}
		if ts, ok := s.(idempotency.TxStore); ok {
			_, _, err := ts.BeginClaim(ctx, nil)
			calls = append(calls, err)
		}
		if o, ok := s.(idempotency.OwnerReleaser); ok {
			_, err := o.ReleaseOwner(ctx, idempotency.ClaimRequest{})
			calls = append(calls, err)
		}
		if c, ok := s.(checker); ok {
			calls = append(calls, c.Check(ctx))
		}
		for i, err := range calls {
			if !errors.Is(err, errPart) {
				t.Errorf("inner %v: call %d did not reach the inner store: %v", want, i, err)
			}
		}
	}
	if len(seen) != 8 {
		t.Fatalf("%d combinations tested, want 8", len(seen))
	}

	// The stores of this package.
	for name, c := range map[string]struct {
		inner idempotency.Store
		want  [4]bool
	}{
		"memory":   {idempotency.NewMemoryStore(), [4]bool{false, true, false, false}},
		"postgres": {idempotency.NewPostgresStore(testdb.New(t)), [4]bool{true, true, true, true}},
	} {
		if got := has(c.inner); got != c.want {
			t.Fatalf("%s store: %v, want %v", name, got, c.want)
		}
		if got := has(sealing(t, c.inner, sealKeysOf(t, "k1"))); got != c.want {
			t.Errorf("sealing %s store: %s", name, fmt.Sprint(got))
		}
	}
}

// budgetPart is a store whose database bounds a transactional claim's
// lock waits its own way (sqlstore.Store on MySQL 8.0 counts seconds).
type budgetPart struct{}

func (budgetPart) TxLockWaitBudget(time.Duration) time.Duration { return time.Hour }

// TestSealingStoreKeepsTheTxLockWaitBudget: the middleware asks a
// transactional store how long its claim may wait on locks; through the
// sealing store it gets the inner store's answer, so a route the inner
// store would refuse is refused, and one over a store without its own
// budget is accepted as it would be unwrapped.
func TestSealingStoreKeepsTheTxLockWaitBudget(t *testing.T) {
	t.Parallel()
	var base struct{ idempotency.Store }
	base.Store = idempotency.NewMemoryStore()
	for name, c := range map[string]struct {
		inner   idempotency.Store
		refused bool
	}{
		"an hour's budget": {struct {
			idempotency.Store
			txPart
			budgetPart
		}{base, txPart{}, budgetPart{}}, true},
		"the default budget": {struct {
			idempotency.Store
			txPart
		}{base, txPart{}}, false},
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
