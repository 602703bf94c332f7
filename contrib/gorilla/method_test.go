package idemgorilla_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gorilla/mux"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gorilla"
	"github.com/idemkit/idempotency/internal/routertest"
)

// TestGorillaWrongMethod: the docs/frameworks.md recipe (one route on the sub-router)
// answers a wrong method with gorilla/mux v1.8.1's 405; a later route on the
// same sub-router makes it 404 (mux clears the method mismatch when a later
// route's prefix matches). Neither reaches the middleware.
func TestGorillaWrongMethod(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		later  bool // a route registered after /orders on the sub-router
		status int
	}{
		{"the recipe", false, http.StatusMethodNotAllowed},
		{"a later route on the sub-router", true, http.StatusNotFound},
	} {
		kit := routertest.New(t, idempotency.Config{RouteName: idemgorilla.RouteName})
		r := mux.NewRouter()
		api := r.PathPrefix("/accounts/{id}").Subrouter()
		api.Use(kit.MW.MustRoute(idempotency.RouteConfig{}))
		api.HandleFunc("/orders", created).Methods("POST")
		if c.later {
			api.HandleFunc("/rejects", rejected).Methods("POST")
		}
		srv := httptest.NewServer(r)
		if got := routertest.Send(t, srv, "PUT", "/accounts/a1/orders", routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s: PUT answered %d, want %d", c.name, got.Status, c.status)
		}
		if n := kit.Rows(t); n != 0 {
			t.Errorf("%s: gorilla's own answer was claimed (%d rows)", c.name, n)
		}
		srv.Close()
	}
}
