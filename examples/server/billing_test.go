package main

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// billingClock is a settable clock for the fake billing provider.
type billingClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *billingClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *billingClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testBilling returns a fake billing provider on its own clock.
func testBilling(retention time.Duration, maxSessions int) (*fakeBilling, *billingClock) {
	clock := &billingClock{t: time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)}
	b := newFakeBilling()
	b.retention, b.maxSessions, b.now = retention, maxSessions, clock.now
	return b, clock
}

// kept returns how many sessions and keys the fake holds.
func (b *fakeBilling) kept() (sessions, keys int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, list := range b.sessions {
		sessions += len(list)
	}
	return sessions, len(b.byKey)
}

// TestFakeBillingRetention: the fake provider forgets a session, and the
// idempotency key that created it, once its retention (the route's TTL) has
// passed; until then the key still deduplicates.
func TestFakeBillingRetention(t *testing.T) {
	t.Parallel()
	b, clock := testBilling(time.Hour, 1000)
	first, ok := b.create(1, "pro", "k1")
	if !ok {
		t.Fatal("create refused")
	}
	clock.advance(30 * time.Minute)
	b.create(2, "team", "k2")
	b.create(1, "basic", "")
	if again, ok := b.create(1, "pro", "k1"); !ok || again.ID != first.ID {
		t.Fatalf("k1 within its retention created %s, want %s", again.ID, first.ID)
	}
	if s, k := b.kept(); s != 3 || k != 2 {
		t.Fatalf("kept %d sessions and %d keys, want 3 and 2", s, k)
	}

	clock.advance(31 * time.Minute) // k1's session is past its hour
	if got := b.list(1); len(got) != 1 || got[0].Plan != "basic" {
		t.Errorf("user 1 lists %v, want the basic session only", got)
	}
	if s, k := b.kept(); s != 2 || k != 1 {
		t.Errorf("kept %d sessions and %d keys, want 2 and 1", s, k)
	}
	if again, ok := b.create(1, "team", "k1"); !ok || again.ID == first.ID {
		t.Errorf("k1 after its retention: %s, %v; want a new session", again.ID, ok)
	}

	clock.advance(2 * time.Hour)
	b.list(3)
	if s, k := b.kept(); s != 0 || k != 0 {
		t.Errorf("after every retention: kept %d sessions and %d keys", s, k)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sessions) != 0 || len(b.created) != 0 {
		t.Errorf("users %d, created %d left", len(b.sessions), len(b.created))
	}
}

// TestFakeBillingCap: past its maximum the fake drops the oldest sessions,
// whoever they belong to, so its memory stays bounded.
func TestFakeBillingCap(t *testing.T) {
	t.Parallel()
	b, _ := testBilling(time.Hour, 5)
	for i := range 12 {
		b.create(int64(i%3), "pro", fmt.Sprint("k", i))
	}
	if s, k := b.kept(); s != 5 || k != 5 {
		t.Fatalf("kept %d sessions and %d keys, want 5 and 5", s, k)
	}
	total := 0
	for u := range int64(3) {
		total += len(b.list(u))
	}
	if total != 5 {
		t.Errorf("lists hold %d sessions, want 5", total)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range 12 { // the oldest seven are gone, the newest five kept
		_, found := b.byKey[billingKey{int64(i % 3), fmt.Sprint("k", i)}]
		if found != (i >= 7) {
			t.Errorf("k%d kept: %v, want %v", i, found, i >= 7)
		}
	}
}
