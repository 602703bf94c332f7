// Package routertest drives a real HTTP server of a router wrapped by the
// middleware and checks that the client saw exactly what was recorded and
// what is replayed. The contrib modules' framework tests share it.
package routertest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	"github.com/prometheus/client_golang/prometheus"
)

// Kit is a Middleware over a MemoryStore, always enabled, logging nowhere.
type Kit struct {
	Store *idempotency.MemoryStore
	MW    *idempotency.Middleware
}

// New returns a Kit configured by cfg (its Enabled, Logger and Registerer
// are replaced).
func New(t testing.TB, cfg idempotency.Config) *Kit {
	t.Helper()
	cfg.Enabled = func(context.Context) bool { return true }
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Registerer = prometheus.NewRegistry()
	store := idempotency.NewMemoryStore()
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Kit{Store: store, MW: mw}
}

// Seen is what a client saw.
type Seen struct {
	Status int
	Header http.Header
	Body   []byte
}

// Key returns a fresh idempotency key.
func Key() string { return uuid.NewString() }

// Send sends one request to srv with key ("" for none) and returns what the
// client saw. It never hangs: the client gives up after 10s.
func Send(t testing.TB, srv *httptest.Server, method, path, key, body string) Seen {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return Seen{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// Record returns the stored row of key; it fails the test when there is
// none.
func (k *Kit) Record(t testing.TB, key string) idempotency.Record {
	t.Helper()
	rows, err := k.Store.ExportScope(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Key == key {
			return r
		}
	}
	t.Fatalf("no record of key %s", key)
	return idempotency.Record{}
}

// Rows returns how many rows the store holds.
func (k *Kit) Rows(t testing.TB) int {
	t.Helper()
	rows, err := k.Store.ExportScope(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}

// replayable are the headers every route records.
var replayable = []string{"Content-Type", "Location", "Content-Language"}

// SawRecorded fails the test unless the client saw the recorded response:
// status, body and the replayable headers (present or absent alike).
func SawRecorded(t testing.TB, seen Seen, rec idempotency.Record) {
	t.Helper()
	if rec.Status != idempotency.StatusCompleted {
		t.Fatalf("record status %s, want completed (client saw %d %q)", rec.Status, seen.Status, seen.Body)
	}
	resp := rec.Response
	if seen.Status != resp.Status {
		t.Errorf("client saw status %d, recorded %d", seen.Status, resp.Status)
	}
	if !bytes.Equal(seen.Body, resp.Body) {
		t.Errorf("client saw body %q, recorded %q", seen.Body, resp.Body)
	}
	if v := seen.Header.Get(idempotency.HeaderReplayed); v != "" {
		t.Errorf("the original response carries %s: %q", idempotency.HeaderReplayed, v)
	}
	sameHeaders(t, "the original", seen.Header, resp.Header)
}

// Replayed fails the test unless replay is the replay of the recorded
// response: same status, same replayable headers, Idempotent-Replayed:
// true, and the same body (a JSON object with "idempotency_replayed": true
// added).
func Replayed(t testing.TB, replay Seen, rec idempotency.Record) {
	t.Helper()
	resp := rec.Response
	if replay.Status != resp.Status {
		t.Errorf("replay status %d, recorded %d", replay.Status, resp.Status)
	}
	if replay.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("replay lacks %s: true (status %d, body %q)", idempotency.HeaderReplayed, replay.Status, replay.Body)
	}
	sameHeaders(t, "the replay", replay.Header, resp.Header)
	want := resp.Body
	if resp.BodyKind == idempotency.BodyJSON {
		var obj map[string]any
		if json.Unmarshal(resp.Body, &obj) == nil {
			var got map[string]any
			if err := json.Unmarshal(replay.Body, &got); err != nil {
				t.Fatalf("replay body %q is not a JSON object: %v", replay.Body, err)
			}
			obj["idempotency_replayed"] = true
			if !reflect.DeepEqual(got, obj) {
				t.Errorf("replay body %q, recorded %q (plus the marker)", replay.Body, resp.Body)
			}
			return
		}
	}
	if !bytes.Equal(replay.Body, want) {
		t.Errorf("replay body %q, recorded %q", replay.Body, want)
	}
}

func sameHeaders(t testing.TB, what string, seen, recorded http.Header) {
	t.Helper()
	for _, name := range replayable {
		if got, want := seen.Values(name), recorded.Values(name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s's %s = %q, recorded %q", what, name, got, want)
		}
	}
}

// RoundTrip sends the request twice with one fresh key and checks that the
// first answer is what was recorded and the second its replay. It returns
// the key, the record and the first answer.
func (k *Kit) RoundTrip(t testing.TB, srv *httptest.Server, method, path, body string) (string, idempotency.Record, Seen) {
	t.Helper()
	key := Key()
	first := Send(t, srv, method, path, key, body)
	rec := k.Record(t, key)
	SawRecorded(t, first, rec)
	Replayed(t, Send(t, srv, method, path, key, body), rec)
	return key, rec, first
}

// Failed checks that key's record is failed and that the same key is
// answered 409 idempotency_previous_failed.
func (k *Kit) Failed(t testing.TB, srv *httptest.Server, method, path, key, body string) {
	t.Helper()
	if rec := k.Record(t, key); rec.Status != idempotency.StatusFailed {
		t.Fatalf("record status %s, want failed", rec.Status)
	}
	again := Send(t, srv, method, path, key, body)
	if again.Status != http.StatusConflict || !bytes.Contains(again.Body, []byte("idempotency_previous_failed")) {
		t.Fatalf("retry of a failed key: %d %q, want 409 idempotency_previous_failed", again.Status, again.Body)
	}
}

// RouteNameOf returns what routeName answers for r as the middleware asks
// it (Config.RouteName, with the request in its context), outside any
// router: r goes straight to a route with no name.
func RouteNameOf(t testing.TB, routeName func(context.Context) string, r *http.Request) string {
	t.Helper()
	got, asked := "", false
	kit := New(t, idempotency.Config{RouteName: func(ctx context.Context) string {
		got, asked = routeName(ctx), true
		return got
	}})
	r.Header.Set(idempotency.HeaderKey, Key())
	kit.MW.MustRoute(idempotency.RouteConfig{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).
		ServeHTTP(httptest.NewRecorder(), r)
	if !asked {
		t.Fatal("routertest: the middleware never asked Config.RouteName")
	}
	return got
}
