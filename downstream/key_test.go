package downstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
)

// quiet drops the middleware's logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// on is a kill-switch that is on.
func on(context.Context) bool { return true }

// ids are the derived ids a test handler reports, or its error.
type ids struct {
	Entry, Hedge, Bank string
	Err                string
}

// derive reads the ids of one call: (broker, entry), (broker, hedge) and
// (bank, entry), all under the Alpaca profile.
func derive(ctx context.Context) (got ids, err error) {
	for _, d := range []struct {
		name, leg string
		into      *string
	}{{"broker", "entry", &got.Entry}, {"broker", "hedge", &got.Hedge}, {"bank", "entry", &got.Bank}} {
		if *d.into, err = downstream.Key(ctx, d.name, d.leg, downstream.Alpaca); err != nil {
			return ids{Err: err.Error()}, err
		}
	}
	return got, nil
}

// deriving is a handler answering 201 with its ids, or 503 with the
// error, sent to errs when errs is not nil.
func deriving(errs chan<- error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := derive(r.Context())
		if errs != nil {
			errs <- err
		}
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusCreated)
		}
		_ = json.NewEncoder(w).Encode(got)
	})
}

// post sends key (none when "") as user to h and returns the ids answered.
func post(t *testing.T, h http.Handler, key, user string) (ids, *httptest.ResponseRecorder) {
	t.Helper()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"qty":1}`))
	if key != "" {
		r.Header.Set(idempotency.HeaderKey, key)
	}
	r.Header.Set("X-User", user)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var got ids
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("answer %d %q: %v", w.Code, w.Body, err)
	}
	return got, w
}

// newMiddleware returns a middleware on store deriving under keys (nil:
// no DeriveKeys), scoped by the X-User header.
func newMiddleware(t *testing.T, store idempotency.Store, keys idempotency.DeriveKeys, enabled func(context.Context) bool) *idempotency.Middleware {
	t.Helper()
	cfg := idempotency.Config{Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: enabled,
		Scope: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-User")
		}}
	if keys != nil {
		cfg.DeriveKeys = keys
	}
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// TestKeyDiffersPerIdentity: inside a handler, the id differs per leg,
// per downstream name, per user scope, per endpoint and per key, and a
// replay answers the first run's ids.
func TestKeyDiffersPerIdentity(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t, idempotency.NewMemoryStore(), downstream.TestKeyring(t, "A"), on)
	orders := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(deriving(nil))
	hedges := mw.MustRoute(idempotency.RouteConfig{Name: "hedges"})(deriving(nil))
	key := uuid.NewString()
	first, w := post(t, orders, key, "alice")
	if w.Code != http.StatusCreated {
		t.Fatalf("first run: %d %s", w.Code, w.Body)
	}
	seen := map[string]string{}
	add := func(what, id string) {
		if other, dup := seen[id]; dup {
			t.Errorf("%s derives %q, as %s does", what, id, other)
		}
		seen[id] = what
	}
	add("leg entry", first.Entry)
	add("leg hedge", first.Hedge)
	add("downstream bank", first.Bank)
	other, _ := post(t, orders, key, "bob")
	add("scope bob", other.Entry)
	other, _ = post(t, hedges, key, "alice")
	add("endpoint hedges", other.Entry)
	other, _ = post(t, orders, uuid.NewString(), "alice")
	add("another key", other.Entry)
	replay, w := post(t, orders, key, "alice")
	if w.Header().Get(idempotency.HeaderReplayed) != "true" || replay != first {
		t.Errorf("a retry: replayed %q, ids %+v; want the first run's %+v", w.Header().Get(idempotency.HeaderReplayed), replay, first)
	}
}

// TestKeyInDo: a Do function derives as a handler does, the same id on
// every call of the key (the replay returns the first run's), another for
// another key; the name and leg change it.
func TestKeyInDo(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t, idempotency.NewMemoryStore(), downstream.TestKeyring(t, "A"), on)
	op, err := mw.Operation("orders", idempotency.RouteConfig{MinKeyLength: 16})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	call := func(key string) ids {
		got, _, err := idempotency.Do(t.Context(), op, idempotency.Call{Key: key, Scope: "alice"}, func(ctx context.Context) (ids, error) {
			runs++
			return derive(ctx)
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		return got
	}
	key := "message-" + uuid.NewString()
	a, b := call(key), call(key)
	if a != b || runs != 1 || a.Entry == "" || a.Entry == a.Hedge || a.Entry == a.Bank {
		t.Errorf("Do: %+v then %+v after %d runs", a, b, runs)
	}
	if c := call("message-" + uuid.NewString()); c.Entry == a.Entry {
		t.Errorf("another key derives the same id %q", c.Entry)
	}
}

// TestKeyRefusedWithoutAKey: with no key to derive from, Key answers
// ErrNoKey: on an optional-key route called without one, with the
// kill-switch off, and outside any wrapped handler. Without
// Config.DeriveKeys it answers ErrNoKeyring; with an empty name, an
// error of its own.
func TestKeyRefusedWithoutAKey(t *testing.T) {
	t.Parallel()
	keys := downstream.TestKeyring(t, "A")
	for _, tc := range []struct {
		name    string
		keys    idempotency.DeriveKeys
		enabled func(context.Context) bool
		key     string
		want    error
	}{
		{"OptionalKeyRouteWithoutKey", keys, on, "", downstream.ErrNoKey},
		{"KillSwitchOff", keys, func(context.Context) bool { return false }, uuid.NewString(), downstream.ErrNoKey},
		{"NoDeriveKeys", nil, on, uuid.NewString(), downstream.ErrNoKeyring},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make(chan error, 3)
			mw := newMiddleware(t, idempotency.NewMemoryStore(), tc.keys, tc.enabled)
			h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(deriving(errs))
			if _, w := post(t, h, tc.key, "alice"); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("answer %d %s, want the handler's 503", w.Code, w.Body)
			}
			if err := <-errs; !errors.Is(err, tc.want) {
				t.Errorf("Key: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := downstream.Key(context.Background(), "broker", "entry", downstream.OKX); !errors.Is(err, downstream.ErrNoKey) {
		t.Errorf("Key outside a handler: %v, want ErrNoKey", err)
	}
	mw := newMiddleware(t, idempotency.NewMemoryStore(), keys, on)
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := downstream.Key(r.Context(), "", "entry", downstream.OKX); err == nil || errors.Is(err, downstream.ErrNoKey) {
			t.Errorf("Key with an empty name: %v, want an error of its own", err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest("POST", "/orders", nil)
	r.Header.Set(idempotency.HeaderKey, uuid.NewString())
	h.ServeHTTP(httptest.NewRecorder(), r)
}

// downStore is a store that cannot be reached: every claim and probe
// fails as a lost connection, so a fail-open route bypasses it.
type downStore struct{ idempotency.Store }

func (downStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	return idempotency.ClaimResult{}, &idempotency.StoreError{Op: "claim", Reason: idempotency.ReasonConnection, Err: errors.New("connection refused")}
}

func (downStore) Probe(context.Context) error {
	return &idempotency.StoreError{Op: "probe", Reason: idempotency.ReasonConnection, Err: errors.New("connection refused")}
}

// TestKeyOnAFailOpenBypass: a fail-open route that bypasses its store
// still has the key, so the handler derives, under the active key, the
// ids a claimed run derives.
func TestKeyOnAFailOpenBypass(t *testing.T) {
	t.Parallel()
	keys := downstream.TestKeyring(t, "A", "old")
	key := uuid.NewString()
	claimed := newMiddleware(t, idempotency.NewMemoryStore(), keys, on).MustRoute(idempotency.RouteConfig{Name: "orders"})(deriving(nil))
	want, w := post(t, claimed, key, "alice")
	if w.Code != http.StatusCreated {
		t.Fatalf("claimed run: %d %s", w.Code, w.Body)
	}
	bypassed := newMiddleware(t, downStore{idempotency.NewMemoryStore()}, keys, on).
		MustRoute(idempotency.RouteConfig{Name: "orders", FailOpen: true})(deriving(nil))
	got, w := post(t, bypassed, key, "alice")
	if w.Code != http.StatusCreated || got != want {
		t.Errorf("bypass: %d %+v, want 201 with the claimed run's %+v", w.Code, got, want)
	}
}
