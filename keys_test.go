package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseKeyOpaque(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", MaxKeyLength)
	good := map[string]string{
		"a":                      "a",
		"AbC":                    "AbC",
		" x y \t":                "x y",
		"a b":                    "a b",
		`"a\"b"`:                 `a"b`,
		`"a\\b"`:                 `a\b`,
		`"AbC"`:                  "AbC",
		`a"b`:                    `a"b`,
		"a;b=c":                  "a;b=c",
		long:                     long,
		`"` + long + `"`:         long,
		"~!#$%&'()*+,-./:<>?":    "~!#$%&'()*+,-./:<>?",
		testKey:                  testKey,
		strings.ToUpper(testKey): strings.ToUpper(testKey), // never case-folded
	}
	for in, want := range good {
		got, err := ParseKey(in, KeyOpaque)
		if err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", " ", `""`, long + "k", `"` + long + `k"`, "a\x01b", "a\x7fb", "é", `"abc`,
		`"abc";a=b`, `"a"b"`, `"a\nb"`, `"a\x"`, `"a\`, "\"a\tb\""} {
		if got, err := ParseKey(in, KeyOpaque); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %q, %v; want ErrInvalidKey", in, got, err)
		}
	}
	if got, err := ParseKey(`"`+strings.ToUpper(testKey)+`"`, KeyUUID); err != nil || got != testKey {
		t.Errorf("UUID form: %q %v", got, err)
	}
	if _, err := ParseKey("abc", KeyUUID); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("UUID route took abc: %v", err)
	}
}

// TestOpaqueKeysRoute: keys compared exactly, the 400's wording, the
// minimum length.
func TestOpaqueKeysRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Scope: func(context.Context) string { return "u" }})
	rt := h.route(RouteConfig{Name: "orders", KeyFormat: KeyOpaque, MinKeyLength: 3}, orderHandler)
	for _, k := range []string{"AbC", "abc", `"AbC"`, "AbC"} {
		send(t, rt, "POST", "/orders", k, `{"a":1}`)
	}
	if h.calls.Load() != 2 {
		t.Fatalf("calls = %d: AbC and abc must be two keys, the quoted form the same key", h.calls.Load())
	}
	for _, k := range []string{"ab", strings.Repeat("x", 256), "caf\u00e9"} {
		w := send(t, rt, "POST", "/orders", k, `{}`)
		assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be 1-255 characters"}`)
	}
	w := send(t, rt, "POST", "/orders", "abc", `{}`, HeaderKey, "abc")
	assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be 1-255 characters"}`)
	if counter(t, h.mw.metrics.rejections.WithLabelValues("orders", "invalid_key")) != 4 {
		t.Fatal("refused keys not counted as invalid_key")
	}
}

// stripeKey is how stripe-go makes idempotency keys
// (stripe.NewIdempotencyKey): the time in nanoseconds, '_', and six
// characters of URL-safe base64.
func stripeKey() string {
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	return fmt.Sprintf("%v_%v", time.Now().UnixNano(), base64.URLEncoding.EncodeToString(buf)[:6])
}

// TestStripeKeys: Stripe's Go client's keys work on an opaque route
// guarded by length alone (no user scope).
func TestStripeKeys(t *testing.T) {
	t.Parallel()
	mw, err := New(NewMemoryStore(), Config{Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	rt := mw.MustRoute(RouteConfig{Name: "charges", KeyFormat: KeyOpaque, MinKeyLength: 20})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if got, _ := KeyFromContext(r.Context()); got == "" {
			t.Error("no key in the handler's context")
		}
		orderHandler(w, r)
	}))
	k1, k2 := stripeKey(), stripeKey()
	for _, k := range []string{k1, k1, k2} {
		if w := send(t, rt, "POST", "/charges", k, `{"amount":100}`); w.Code != 201 {
			t.Fatalf("key %q: %d %s", k, w.Code, w.Body)
		}
	}
	if calls != 2 {
		t.Fatalf("calls = %d, want 2 (%s replayed once)", calls, k1)
	}
	if w := send(t, rt, "POST", "/charges", testKey, `{}`); w.Code != 201 {
		t.Fatalf("a UUID is an opaque key too: %d", w.Code)
	}
}

// TestOpaqueKeysGuard: an opaque route needs a user scope or a minimum key
// length, so "all" or "admin" cannot reach another client's response.
func TestOpaqueKeysGuard(t *testing.T) {
	t.Parallel()
	unscoped, _ := New(NewMemoryStore(), Config{})
	scoped, _ := New(NewMemoryStore(), Config{Scope: func(context.Context) string { return "u" }})
	parse := func(v string) (string, error) { return v, nil }
	for _, c := range []struct {
		mw   *Middleware
		rc   RouteConfig
		want string // "" for no error
	}{
		{unscoped, RouteConfig{KeyFormat: KeyOpaque}, "needs a user scope"},
		{unscoped, RouteConfig{KeyFormat: KeyOpaque, MinKeyLength: 15}, "needs a user scope"},
		{unscoped, RouteConfig{ParseKey: parse}, "needs a user scope"},
		{unscoped, RouteConfig{KeyFormat: KeyOpaque, MinKeyLength: 16}, ""},
		{unscoped, RouteConfig{ParseKey: parse, MinKeyLength: 16}, ""},
		{scoped, RouteConfig{KeyFormat: KeyOpaque}, ""},
		{scoped, RouteConfig{ParseKey: parse}, ""},
		{unscoped, RouteConfig{}, ""},
		{unscoped, RouteConfig{MinKeyLength: 20}, "opaque keys only"},
		{scoped, RouteConfig{KeyFormat: KeyOpaque, MinKeyLength: 256}, "MinKeyLength"},
		{scoped, RouteConfig{KeyFormat: 9}, "KeyFormat"},
	} {
		_, err := c.mw.Route(c.rc)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.rc, err, c.want)
		}
	}
}

// TestCustomKeyParser: the route's own parser decides, and the key it
// returns is what is stored and compared.
func TestCustomKeyParser(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Scope: func(context.Context) string { return "u" }})
	rt := h.route(RouteConfig{Name: "orders", MinKeyLength: 5, ParseKey: func(v string) (string, error) {
		k, ok := strings.CutPrefix(v, "ord_")
		if !ok {
			return "", errors.New("want ord_...")
		}
		return strings.ToLower(k), nil
	}}, orderHandler)
	send(t, rt, "POST", "/orders", "ord_ABCDEF", `{}`)
	if w := send(t, rt, "POST", "/orders", "ord_abcdef", `{}`); w.Header().Get(HeaderReplayed) != "true" || h.calls.Load() != 1 {
		t.Fatalf("the parser's key was not the one compared: %d, calls %d", w.Code, h.calls.Load())
	}
	for _, k := range []string{"abcdef", "ord_abc", "ord_" + strings.Repeat("a", 256), "ord_a\x00bcdef"} {
		w := send(t, rt, "POST", "/orders", k, `{}`)
		assertJSONError(t, w, 400, `{"error":"Idempotency-Key must be 1-255 characters"}`)
	}
}

// TestOpaqueKeysNeedTheScope: on an opaque route guarded by Config.Scope
// (MinKeyLength below 16), a request whose scope is empty (an anonymous
// caller) is refused before any claim; otherwise two anonymous clients
// sending "1" would share one key. A route guarded by length, and a UUID
// route, still take unscoped requests.
func TestOpaqueKeysNeedTheScope(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{}) // the scope is X-User's value
	short := h.route(RouteConfig{Name: "short", KeyFormat: KeyOpaque}, orderHandler)
	for _, user := range []string{"", ""} {
		w := send(t, short, "POST", "/orders", "1", `{}`, "X-User", user)
		assertJSONError(t, w, 400, `{"error":"idempotency_scope_invalid"}`)
	}
	if h.calls.Load() != 0 {
		t.Fatalf("an unscoped request with the short key \"1\" ran (%d calls)", h.calls.Load())
	}
	for _, user := range []string{"alice", "bob"} {
		if w := send(t, short, "POST", "/orders", "1", `{}`, "X-User", user); w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
			t.Fatalf("%s: %d %s, want its own run", user, w.Code, w.Body)
		}
	}
	long := h.route(RouteConfig{Name: "long", KeyFormat: KeyOpaque, MinKeyLength: 16}, orderHandler)
	uuidRoute := h.route(RouteConfig{Name: "uuid"}, orderHandler)
	for _, rt := range []http.Handler{long, uuidRoute} {
		if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != 201 {
			t.Fatalf("an unscoped request with a UUID key: %d %s", w.Code, w.Body)
		}
	}
	if _, err := h.mw.Route(RouteConfig{Name: "x", FollowKillSwitch: true}); err == nil {
		t.Error("a route took FollowKillSwitch")
	}
	unscoped, _ := New(NewMemoryStore(), Config{})
	if _, err := unscoped.Route(RouteConfig{Name: "x", Scoped: true}); err == nil || !strings.Contains(err.Error(), "Config.Scope") {
		t.Errorf("a Scoped route without Config.Scope: %v", err)
	}
}
