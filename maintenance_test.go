package idempotency

import (
	"context"
	"testing"
	"time"
)

func TestCleanupAndErase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r"}, orderHandler)
	for i, k := range []string{testKey, testKey2} {
		send(t, rt, "POST", "/r", k, `{}`, "X-User", string(rune('1'+i)))
	}
	if res, err := h.mw.Erase(context.Background(), "1"); err != nil || res.Deleted != 1 {
		t.Fatalf("erase: %+v %v", res, err)
	}
	h.clock.Advance(DefaultTTL + time.Minute)
	n, err := h.mw.Cleanup(context.Background(), 1)
	if err != nil || n != 1 {
		t.Fatalf("cleanup deleted %d (%v), want 1", n, err)
	}
	if counter(t, h.mw.metrics.cleanupDeleted) != 1 {
		t.Fatal("cleanup not counted")
	}
}
