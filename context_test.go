package idempotency

import (
	"net/http"
	"strings"
	"testing"
)

func TestKeyFromContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	var got string
	var deadline bool
	rt := h.route(RouteConfig{Name: "r"}, func(w http.ResponseWriter, r *http.Request) {
		got, _ = KeyFromContext(r.Context())
		_, deadline = r.Context().Deadline()
	})
	send(t, rt, "POST", "/r", strings.ToUpper(testKey), `{}`)
	if got != testKey || !deadline {
		t.Fatalf("key %q deadline %v: want the lower-case key and a deadline", got, deadline)
	}
	got, deadline = "x", true
	send(t, rt, "POST", "/r", "", `{}`)
	if got != "" || deadline {
		t.Fatalf("pass-through: key %q deadline %v, want none", got, deadline)
	}
}
