package idempotency

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

type ctxMarker struct{}

// observations collects what an Observer is told, checking that each call
// carries the request's context.
type observations struct {
	t   *testing.T
	mu  sync.Mutex
	got []Observation
}

func (o *observations) observe(ctx context.Context, ob Observation) {
	if ctx.Value(ctxMarker{}) != "req" {
		o.t.Errorf("Observer got a context without the request's values: %+v", ob)
	}
	o.mu.Lock()
	o.got = append(o.got, ob)
	o.mu.Unlock()
}

// sendObserved sends one request with a marked context and returns the
// one Observation it produced.
func (o *observations) sendObserved(t *testing.T, h http.Handler, key, body string, hdr ...string) (Observation, *httptest.ResponseRecorder) {
	t.Helper()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	r = r.WithContext(context.WithValue(r.Context(), ctxMarker{}, "req"))
	if key != "" {
		r.Header.Set(HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	func() {
		defer func() { _ = recover() }()
		h.ServeHTTP(w, r)
	}()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.got) != 1 {
		t.Fatalf("%d observations for one request: %+v", len(o.got), o.got)
	}
	ob := o.got[0]
	o.got = nil
	return ob, w
}

func TestObserver(t *testing.T) {
	t.Parallel()
	obs := &observations{t: t}
	h := newHarness(t, Config{Observer: obs.observe})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	failing := h.route(RouteConfig{Name: "fails"}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) })
	panics := h.route(RouteConfig{Name: "panics"}, func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	open := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)

	for _, c := range []struct {
		name    string
		h       http.Handler
		key     string
		body    string
		hdr     []string
		want    Observation // Duration and StoreDuration checked apart
		claimed bool        // a store call was made
	}{
		{"no key", rt, "", `{}`, nil, Observation{Outcome: OutcomePassThrough, Endpoint: "orders"}, false},
		{"new key", rt, testKey, `{"a":1}`, []string{"X-User", "u1"}, Observation{Outcome: OutcomeExecuted, Reason: "completed", Endpoint: "orders", Scope: "u1", Status: 201, Miss: true}, true},
		{"replay", rt, testKey, `{"a":1}`, []string{"X-User", "u1"}, Observation{Outcome: OutcomeReplayed, Endpoint: "orders", Scope: "u1", Status: 201, Hit: true}, true},
		{"mismatch", rt, testKey, `{"a":2}`, []string{"X-User", "u1"}, Observation{Outcome: OutcomeConflict, Reason: "body_mismatch", Endpoint: "orders", Scope: "u1", Status: 422, Hit: true}, true},
		{"bad key", rt, "nope", `{}`, nil, Observation{Outcome: OutcomeRejected, Reason: "invalid_key", Endpoint: "orders", Status: 400}, false},
		{"handler 502", failing, testKey2, `{}`, nil, Observation{Outcome: OutcomeExecuted, Reason: "failed", Endpoint: "fails", Status: 502, Miss: true}, true},
		{"panic", panics, testKey2, `{}`, nil, Observation{Outcome: OutcomeExecuted, Reason: "failed", Endpoint: "panics", Miss: true}, true},
	} {
		ob, _ := obs.sendObserved(t, c.h, c.key, c.body, c.hdr...)
		got := ob
		got.Duration, got.StoreDuration = 0, 0
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if ob.Duration <= 0 || ob.StoreDuration > ob.Duration || (ob.StoreDuration > 0) != c.claimed {
			t.Errorf("%s: durations %v, store %v", c.name, ob.Duration, ob.StoreDuration)
		}
	}

	e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("refused")})
	h.store.fail.Store(&e)
	h.store.probe.Store(&e) // the outage probe fails too: the bypass's evidence
	if ob, _ := obs.sendObserved(t, open, testKey, `{}`); ob.Outcome != OutcomeBypassed || ob.Reason != "store_unavailable" {
		t.Errorf("fail-open outage: %+v", ob)
	}
	if ob, _ := obs.sendObserved(t, rt, testKey, `{}`); ob.Outcome != OutcomeRejected || ob.Reason != "store_unavailable" || ob.Status != 503 {
		t.Errorf("fail-closed outage: %+v", ob)
	}
	h.store.fail.Store(nil)
	h.enabled.Store(false)
	if ob, _ := obs.sendObserved(t, rt, testKey, `{}`); ob.Outcome != OutcomeBypassed || ob.Reason != "disabled" {
		t.Errorf("kill-switch: %+v", ob)
	}
}

// TestIdentifiersInLogsAndObservations: keys and scopes logged as they
// are, as HMACs under a secret, or not at all; every log record carries
// the request's context.
func TestIdentifiersInLogsAndObservations(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef-secret")
	for _, c := range []struct {
		name   string
		cfg    Config
		scope  string // Observation.Scope
		inLogs []string
		absent []string
	}{
		{"plain", Config{}, "u1", []string{`"key":"` + testKey + `"`, `"scope":"u1"`}, []string{"_hmac"}},
		{"hmac", Config{IdentifierSecret: secret}, identifierHMAC(secret, "u1"),
			[]string{`"key_hmac":"` + identifierHMAC(secret, testKey) + `"`, `"scope_hmac":"` + identifierHMAC(secret, "u1") + `"`},
			[]string{testKey, `"u1"`, `"key"`, `"scope"`}},
		{"omitted", Config{OmitIdentifiers: true}, "", nil, []string{testKey, `"u1"`, `"key"`, `"scope"`, "_hmac"}},
	} {
		var buf bytes.Buffer
		var ctxs []any
		var mu sync.Mutex
		c.cfg.Logger = slog.New(ctxHandler{slog.NewJSONHandler(&buf, nil), func(ctx context.Context) {
			mu.Lock()
			ctxs = append(ctxs, ctx.Value(ctxMarker{}))
			mu.Unlock()
		}})
		obs := &observations{t: t}
		c.cfg.Observer = obs.observe
		h := newHarness(t, c.cfg)
		mu.Lock()
		ctxs = nil // construction's own records (OmitIdentifiers warns) belong to no request
		mu.Unlock()
		release, started := make(chan struct{}), make(chan struct{})
		rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			orderHandler(w, r)
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
			r.Header.Set(HeaderKey, testKey)
			r.Header.Set("X-User", "u1")
			rt.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithValue(r.Context(), ctxMarker{}, "req")))
		}()
		<-started
		h.clock.Advance(DefaultLease + time.Second)
		obs.mu.Lock()
		obs.got = nil
		obs.mu.Unlock()
		ob, w := obs.sendObserved(t, rt, testKey, `{}`, "X-User", "u1") // stale: a WARN with key and scope
		close(release)
		<-done
		if w.Code != 409 || ob.Scope != c.scope {
			t.Errorf("%s: %d, Observation.Scope %q, want %q", c.name, w.Code, ob.Scope, c.scope)
		}
		logs := buf.String()
		if !strings.Contains(logs, "outcome unknown") {
			t.Fatalf("%s: no WARN logged:\n%s", c.name, logs)
		}
		for _, s := range c.inLogs {
			if !strings.Contains(logs, s) {
				t.Errorf("%s: logs lack %s:\n%s", c.name, s, logs)
			}
		}
		for _, s := range c.absent {
			if strings.Contains(logs, s) {
				t.Errorf("%s: logs contain %s:\n%s", c.name, s, logs)
			}
		}
		mu.Lock()
		for _, v := range ctxs {
			if v != "req" {
				t.Errorf("%s: a log record without the request's context", c.name)
			}
		}
		mu.Unlock()
	}
	if _, err := New(NewMemoryStore(), Config{IdentifierSecret: []byte("short")}); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
	if _, err := New(NewMemoryStore(), Config{IdentifierSecret: secret, OmitIdentifiers: true}); err == nil {
		t.Error("OmitIdentifiers with a secret was accepted")
	}
}

// ctxHandler reports each record's context, then passes it on.
type ctxHandler struct {
	slog.Handler
	seen func(context.Context)
}

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.seen(ctx)
	return h.Handler.Handle(ctx, r)
}

// TestLogCallsPassTheContext: every log call of the package passes a
// context (slog's ...Context methods, or Log with one), so a handler can
// correlate it with the request's trace.
func TestLogCallsPassTheContext(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	bare := regexp.MustCompile(`\blog\.(Debug|Info|Warn|Error)\(|\.Log\(context\.Background\(\)`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if bare.MatchString(line) {
				t.Errorf("%s:%d logs without the request's context: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
