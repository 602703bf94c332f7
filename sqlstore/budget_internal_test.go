package sqlstore

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// TestLockWaitBound: one statement's bound as the database applies it:
// MySQL 8.0's innodb_lock_wait_timeout rounds up to whole seconds, at
// least 1; PostgreSQL and MariaDB (polled) to whole milliseconds.
func TestLockWaitBound(t *testing.T) {
	for _, c := range []struct {
		seconds    bool
		wait, want time.Duration
	}{
		{true, time.Millisecond, time.Second},
		{true, 10 * time.Millisecond, time.Second},
		{true, time.Second, time.Second},
		{true, time.Second + time.Nanosecond, 2 * time.Second},
		{true, 2500 * time.Millisecond, 3 * time.Second},
		{false, 10 * time.Millisecond, 10 * time.Millisecond},
		{false, 1500 * time.Microsecond, 2 * time.Millisecond},
		{false, time.Second, time.Second},
	} {
		if got := lockWaitBound(c.seconds, c.wait); got != c.want {
			t.Errorf("lockWaitBound(seconds=%v, %v) = %v, want %v", c.seconds, c.wait, got, c.want)
		}
	}
}

// TestMySQL80RouteRefusesTxLockWaitPastStoreTimeout: on MySQL 8.0 (no
// server here: the flavour is set by hand, and creating a route does not
// talk to the store) the middleware refuses a transactional route whose
// lock waits, rounded up to seconds, reach the store timeout: the default
// 10ms is five 1s waits, not below the default 2s StoreTimeout.
func TestMySQL80RouteRefusesTxLockWaitPastStoreTimeout(t *testing.T) {
	mysql80 := &Store{d: dialect{name: MySQL}}
	mariadb := &Store{d: dialect{name: MySQL}, mariadb: true}
	if got := mysql80.TxLockWaitBudget(0); got != 5*time.Second {
		t.Fatalf("MySQL 8.0 budget of the default wait: %v, want 5s", got)
	}
	route := func(s *Store, storeTimeout, wait time.Duration) error {
		mw, err := idempotency.New(s, idempotency.Config{StoreTimeout: storeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		_, err = mw.Route(idempotency.RouteConfig{Transactional: true, TxLockWait: wait})
		return err
	}
	if err := route(mysql80, 0, 0); err == nil || !strings.Contains(err.Error(), "5s") {
		t.Errorf("MySQL 8.0, default TxLockWait and StoreTimeout: %v, want refused naming the 5s budget", err)
	}
	if err := route(mysql80, 6*time.Second, 0); err != nil {
		t.Errorf("MySQL 8.0, StoreTimeout 6s: %v, want accepted (5s budget)", err)
	}
	if err := route(mysql80, 6*time.Second, time.Second+time.Millisecond); err == nil {
		t.Error("MySQL 8.0, TxLockWait 1.001s (2s a wait, 10s budget) under StoreTimeout 6s: accepted, want refused")
	}
	if err := route(mariadb, 0, 0); err != nil {
		t.Errorf("MariaDB, defaults: %v, want accepted (50ms budget)", err)
	}
}
