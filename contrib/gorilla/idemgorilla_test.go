package idemgorilla_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gorilla/handlers"
	"github.com/gorilla/mux"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gorilla"
	"github.com/idemkit/idempotency/internal/routertest"
)

func created(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", r.URL.Path+"/7")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":7,"account":"` + mux.Vars(r)["id"] + `"}`))
}

func rejected(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "quantity must be positive", http.StatusBadRequest)
}

func panics(http.ResponseWriter, *http.Request) { panic("boom") }

// recovery is gorilla/handlers' RecoveryHandler, logging nowhere.
func recovery() func(http.Handler) http.Handler {
	return handlers.RecoveryHandler(handlers.RecoveryLogger(log.New(io.Discard, "", 0)))
}

// TestGorilla drives the docs/frameworks.md recipe on a real server: the middleware on
// a sub-router (Use runs after a route matched), a RecoveryHandler around
// the router and one inside the middleware, gorilla's own 404 and 405, and
// a handler's 400.
func TestGorilla(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemgorilla.RouteName})
	orders := kit.MW.MustRoute(idempotency.RouteConfig{})

	r := mux.NewRouter()
	api := r.PathPrefix("/accounts/{id}").Subrouter()
	api.Use(orders)
	api.HandleFunc("/orders", created).Methods("POST")
	api.HandleFunc("/rejects", rejected).Methods("POST")
	api.HandleFunc("/panics", panics).Methods("POST")
	api.Handle("/panics-inside", recovery()(http.HandlerFunc(panics))).Methods("POST")
	r.Handle("/v2/accounts/{id:[a-z0-9]+}/orders", orders(http.HandlerFunc(created))).Methods("POST")
	srv := httptest.NewServer(recovery()(r))
	t.Cleanup(srv.Close)

	for path, endpoint := range map[string]string{
		"/accounts/a1/orders":    "POST /accounts/{id}/orders",
		"/v2/accounts/a1/orders": "POST /v2/accounts/{id:[a-z0-9]+}/orders",
	} {
		_, rec, first := kit.RoundTrip(t, srv, "POST", path, `{"qty":1}`)
		if first.Status != http.StatusCreated || rec.Endpoint != endpoint {
			t.Errorf("%s: status %d, endpoint %q, want 201 %q", path, first.Status, rec.Endpoint, endpoint)
		}
	}
	if _, rec, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/rejects", `{"qty":0}`); first.Status != http.StatusBadRequest || rec.Endpoint != "POST /accounts/{id}/rejects" {
		t.Errorf("a handler's 400: client %d, endpoint %q", first.Status, rec.Endpoint)
	}

	// A panic: the record is failed and re-raised; the client gets the
	// RecoveryHandler's 500, wherever it sits.
	for _, path := range []string{"/accounts/a1/panics", "/accounts/a1/panics-inside"} {
		key := routertest.Key()
		if got := routertest.Send(t, srv, "POST", path, key, `{}`); got.Status != http.StatusInternalServerError {
			t.Errorf("%s: status %d, want 500", path, got.Status)
		}
		kit.Failed(t, srv, "POST", path, key, `{}`)
	}

	// gorilla's own answers: middleware runs only on a match, so never
	// claimed.
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/nowhere", http.StatusNotFound},
		{"POST", "/accounts/a1/nowhere", http.StatusNotFound},
		{"PUT", "/accounts/a1/orders", http.StatusNotFound}, // 404, not 405: later routes share the prefix (TestGorillaWrongMethod)
		{"PUT", "/v2/accounts/a1/orders", http.StatusMethodNotAllowed},
	} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: gorilla's own answer was recorded", c.method, c.path)
		}
	}
}

// TestRouteNameOutsideGorilla: no matched route, no name.
func TestRouteNameOutsideGorilla(t *testing.T) {
	t.Parallel()
	if got := routertest.RouteNameOf(t, idemgorilla.RouteName, httptest.NewRequest("POST", "/x", nil)); got != "" {
		t.Fatalf("RouteName = %q outside gorilla", got)
	}
}
