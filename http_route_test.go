package idempotency

import (
	"context"
	"testing"
)

// TestKeylessPassThrough: a request without a key on a plain route passes
// straight through (no claim, nothing counted), and with the kill-switch
// off it is counted as a bypass, as on any route; the kill-switch hook is
// asked once per request, with the request in its context.
func TestKeylessPassThrough(t *testing.T) {
	t.Parallel()
	var on, asked, sawRequest = true, 0, 0
	h := newHarness(t, Config{Enabled: func(ctx context.Context) bool {
		asked++
		if r, ok := RequestFromContext(ctx); ok && r.URL.Path == "/orders" {
			sawRequest++
		}
		return on
	}})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	send(t, rt, "POST", "/orders", "", `{}`)
	on = false
	send(t, rt, "POST", "/orders", "", `{}`)
	if h.calls.Load() != 2 || h.store.claims.Load() != 0 || asked != 2 || sawRequest != 2 {
		t.Fatalf("calls %d, claims %d, kill-switch asked %d times (%d with the request); want 2, 0, 2, 2",
			h.calls.Load(), h.store.claims.Load(), asked, sawRequest)
	}
	if got := counter(t, h.mw.metrics.bypasses.WithLabelValues("orders", "disabled")); got != 1 {
		t.Fatalf("disabled bypasses = %v, want 1 (the request sent with the kill-switch off)", got)
	}
}
