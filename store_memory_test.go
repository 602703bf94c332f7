package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempotencytest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() })
}

// TestMemoryStoreMaxRows: a full store refuses new keys with reason full,
// still answers the keys it holds, and makes room only from rows cleanup
// could delete.
func TestMemoryStoreMaxRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := idempotency.NewFakeClockForTest()
	s := idempotency.NewMemoryStoreForTest(clock.Now, idempotency.MemoryMaxRows(3))

	short := idempotencytest.Request("u", time.Minute, time.Second)
	reqs := []idempotency.ClaimRequest{short, idempotencytest.Request("u", time.Hour, time.Second), idempotencytest.Request("u", time.Hour, time.Second)}
	var recs []idempotency.Record
	for _, req := range reqs {
		res, err := s.Claim(ctx, req)
		if err != nil || !res.Won {
			t.Fatalf("claim below the cap: won %v, %v", res.Won, err)
		}
		recs = append(recs, res.Record)
	}
	if err := s.Complete(ctx, recs[1].Fence(), recs[1], idempotency.Response{Status: 201, Body: []byte(`{}`), BodyKind: idempotency.BodyJSON}); err != nil {
		t.Fatal(err)
	}

	wantFull := func(what string) {
		t.Helper()
		res, err := s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Second))
		var se *idempotency.StoreError
		if !errors.As(err, &se) || se.Reason != idempotency.ReasonFull || se.Op != "claim" ||
			!errors.Is(err, idempotency.ErrStoreUnavailable) || res.Won {
			t.Fatalf("%s: claim of a new key = won %v, %v; want a StoreError of reason full", what, res.Won, err)
		}
	}
	wantFull("full store")

	// The keys it holds are still answered: a replay, an in-flight key.
	for i, req := range reqs {
		res, err := s.Claim(ctx, req)
		if err != nil || res.Won || res.Record.ID != recs[i].ID {
			t.Errorf("claim of stored key %d in a full store = won %v, id %d, %v", i, res.Won, res.Record.ID, err)
		}
	}

	// A released key makes room.
	if err := s.Release(ctx, recs[2].Fence()); err != nil {
		t.Fatal(err)
	}
	third, err := s.Claim(ctx, idempotencytest.Request("u", time.Hour, time.Hour))
	if err != nil || !third.Won {
		t.Fatalf("claim after a release = won %v, %v", third.Won, err)
	}
	wantFull("full again")

	// An expired row whose lease is over makes room for a new key; an
	// in_flight row whose lease still runs (TTL shorter than the lease,
	// possible only when instances disagree) never does.
	clock.Advance(2 * time.Minute)
	res, err := s.Claim(ctx, idempotencytest.Request("u", time.Minute, time.Hour))
	if err != nil || !res.Won {
		t.Fatalf("claim with an expired row to evict = won %v, %v", res.Won, err)
	}
	left, err := s.ExportScope(ctx, "u")
	if err != nil || len(left) != 3 {
		t.Fatalf("%d rows after the eviction, want 3 (%v)", len(left), err)
	}
	for _, r := range left {
		if r.ID == recs[0].ID {
			t.Errorf("the expired row %d was kept; another was evicted", r.ID)
		}
	}
	clock.Advance(2 * time.Minute) // the new row is expired, its lease runs
	wantFull("only a leased row expired")

	// An expired row is still taken over in a full store: it is no new row.
	clock.Advance(2 * time.Hour)
	old := left[0]
	for _, r := range left {
		if r.ID == recs[1].ID {
			old = r
		}
	}
	req := reqs[1]
	got, err := s.Claim(ctx, req)
	if err != nil || got.Won || !got.Record.Expired {
		t.Fatalf("claim of an expired key = won %v, expired %v, %v", got.Won, got.Record.Expired, err)
	}
	if tk, err := s.Takeover(ctx, old.Fence(), req); err != nil || !tk.Won {
		t.Errorf("takeover in a full store = won %v, %v", tk.Won, err)
	}
}

func TestMemoryMaxRowsNegative(t *testing.T) {
	t.Parallel()
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "MemoryMaxRows must not be negative") {
			t.Errorf("MemoryMaxRows(-1) panicked with %v", p)
		}
	}()
	idempotency.MemoryMaxRows(-1)
}

// TestMemoryStoreCleanupCost: Cleanup looks at the rows it deletes
// and one more, however many live rows the store holds; it used to scan
// every row under the store's one mutex.
func TestMemoryStoreCleanupCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := idempotency.NewFakeClockForTest()
	s := idempotency.NewMemoryStoreForTest(clock.Now)
	const live, expired = 20000, 10
	for i := range live + expired {
		ttl := time.Hour
		if i%(live/expired) == 0 && i/(live/expired) < expired {
			ttl = time.Minute
		}
		res, err := s.Claim(ctx, idempotencytest.Request(fmt.Sprint(i%7), ttl, time.Second))
		if err != nil || !res.Won {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	clock.Advance(2 * time.Minute)

	before := s.CleanupVisitsForTest()
	n, err := s.Cleanup(ctx, 3)
	if err != nil || n != 3 {
		t.Fatalf("Cleanup(3) = %d, %v; want 3", n, err)
	}
	if v := s.CleanupVisitsForTest() - before; v > 3 {
		t.Errorf("Cleanup(3) looked at %d rows of %d to delete 3", v, live+expired)
	}
	before = s.CleanupVisitsForTest()
	n, err = s.Cleanup(ctx, 1000)
	if err != nil || n != expired-3 {
		t.Fatalf("Cleanup(1000) = %d, %v; want %d", n, err, expired-3)
	}
	if v := s.CleanupVisitsForTest() - before; v > expired-3+1 {
		t.Errorf("Cleanup looked at %d rows of %d to delete %d", v, live+expired, n)
	}
}

// TestMemoryStoreCleanupOrder drives a store through random claims,
// outcomes, takeovers and clock steps, and checks after each
// cleanup that it deleted exactly the rows a scan would have (expired, not
// in_flight inside their lease): the cleanup order must follow every change
// of a row's status, expiry and lease.
func TestMemoryStoreCleanupOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := idempotency.NewFakeClockForTest()
	s := idempotency.NewMemoryStoreForTest(clock.Now)
	rng := rand.New(rand.NewPCG(1, 2))
	durations := []time.Duration{time.Second, time.Minute, 10 * time.Minute, time.Hour}
	pick := func() time.Duration { return durations[rng.IntN(len(durations))] }
	scopes := []string{"a", "b", ""}
	all := func() []idempotency.Record {
		var out []idempotency.Record
		for _, sc := range scopes {
			recs, err := s.ExportScope(ctx, sc)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, recs...)
		}
		return out
	}
	var reqs []idempotency.ClaimRequest
	for step := range 3000 {
		switch op := rng.IntN(10); {
		case op < 3 || len(reqs) == 0:
			req := idempotencytest.Request(scopes[rng.IntN(len(scopes))], pick(), pick())
			reqs = append(reqs, req)
			if _, err := s.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
		case op < 7:
			req := reqs[rng.IntN(len(reqs))]
			res, err := s.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			f := res.Record.Fence()
			req.TTL, req.Lease = pick(), pick()
			switch rng.IntN(4) {
			case 0:
				_ = s.Complete(ctx, f, res.Record, idempotency.Response{Status: 200, BodyKind: idempotency.BodyRaw})
			case 1:
				_ = s.Fail(ctx, f)
			case 2:
				_ = s.Release(ctx, f)
			default:
				_, _ = s.Takeover(ctx, f, req)
			}
		case op < 9:
			clock.Advance(time.Duration(rng.Int64N(int64(20 * time.Minute))))
		default:
			before := all()
			deletable := map[int64]bool{}
			for _, r := range before {
				if r.Expired && (r.Status != idempotency.StatusInFlight || r.LeaseOver) {
					deletable[r.ID] = true
				}
			}
			n, err := s.Cleanup(ctx, len(before)+1)
			if err != nil || n != int64(len(deletable)) {
				t.Fatalf("step %d: Cleanup = %d, %v; a scan finds %d", step, n, err, len(deletable))
			}
			after := all()
			for _, r := range after {
				if deletable[r.ID] {
					t.Fatalf("step %d: row %d left behind", step, r.ID)
				}
			}
			if len(after) != len(before)-len(deletable) {
				t.Fatalf("step %d: %d rows left, want %d", step, len(after), len(before)-len(deletable))
			}
		}
	}
}
