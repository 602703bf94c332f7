package idempotency_test

// Promises of the README held on the Postgres store (promises_test.go holds
// them on the memory store).

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestPostgresMismatchCheckedBeforeStatus: on Postgres too, a different
// body on a key in flight or failed is 422, not that state's 409.
func TestPostgresMismatchCheckedBeforeStatus(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(*http.Request) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusInternalServerError)
	}))
	key := uuid.NewString()
	first := make(chan int)
	go func() { first <- do(h, key, `{"qty":1}`).Code }()
	<-started
	check := func(state, want string) {
		t.Helper()
		if w := do(h, key, `{"qty":2}`); w.Code != 422 || w.Body.String() != `{"error":"idempotency_key_body_mismatch"}` {
			t.Fatalf("%s, different body: %d %s, want 422", state, w.Code, w.Body)
		}
		if w := do(h, key, `{"qty":1}`); w.Code != 409 || !strings.Contains(w.Body.String(), want) {
			t.Fatalf("%s, same body: %d %s, want 409 %s", state, w.Code, w.Body, want)
		}
	}
	check("in flight", "idempotency_in_flight")
	close(release)
	if code := <-first; code != 500 {
		t.Fatalf("owner: %d, want 500", code)
	}
	check("failed", "idempotency_previous_failed")
}

// TestPostgresReplayInvalidUTF8Header: headers are stored as JSONB, so a
// header value that is not valid UTF-8 replays with U+FFFD in place of each
// invalid byte (as the README says); the rest of the value is kept.
func TestPostgresReplayInvalidUTF8Header(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(*http.Request) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", ReplayHeaders: []string{"X-Note"}})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/caf\xe9")
			w.Header()["X-Note"] = []string{"ok", "\xff\xfeend"}
			w.WriteHeader(http.StatusCreated)
		}))
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 || w.Header().Get("Location") != "/orders/caf\xe9" {
		t.Fatalf("original: %d, Location %q", w.Code, w.Header().Get("Location"))
	}
	w := do(h, key, `{}`)
	if w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("not a replay: %d %s", w.Code, w.Body)
	}
	if got := w.Header().Get("Location"); got != "/orders/caf\uFFFD" {
		t.Errorf("replayed Location %q, want %q", got, "/orders/caf\uFFFD")
	}
	if got := w.Header().Values("X-Note"); len(got) != 2 || got[0] != "ok" || got[1] != "\uFFFD\uFFFDend" {
		t.Errorf("replayed X-Note %q, want [ok \uFFFD\uFFFDend]", got)
	}
}
