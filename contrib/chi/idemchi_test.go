package idemchi_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/chi"
	"github.com/idemkit/idempotency/internal/routertest"
)

func created(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", r.URL.Path+"/7")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":7,"account":"` + chi.URLParam(r, "id") + `"}`))
}

func rejected(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "quantity must be positive", http.StatusBadRequest)
}

func panics(http.ResponseWriter, *http.Request) { panic("boom") }

func start(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestChi drives the docs/frameworks.md recipe on a real server: a Recoverer outside,
// the idempotency middleware on a group (inline, after routing) and on a
// mounted sub-router (Use, before the sub-router routes), chi's own 404
// and 405, a handler's 400, and panics recovered outside and inside.
func TestChi(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemchi.RouteName})
	orders := kit.MW.MustRoute(idempotency.RouteConfig{})

	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Group(func(r chi.Router) {
		r.Use(orders)
		r.Post("/accounts/{id}/orders", created)
		r.Post("/accounts/{id}/rejects", rejected)
		r.Post("/accounts/{id}/panics", panics)
	})
	r.With(orders, middleware.Recoverer).Post("/accounts/{id}/panics-inside", panics)
	r.Route("/v2/accounts/{id}", func(r chi.Router) {
		r.Use(orders)
		r.Post("/orders", created)
		r.Post("/transfers", created)
	})
	srv := start(t, r)

	for path, endpoint := range map[string]string{
		"/accounts/a1/orders":       "POST /accounts/{id}/orders",
		"/v2/accounts/a1/orders":    "POST /v2/accounts/{id}/orders",
		"/v2/accounts/a1/transfers": "POST /v2/accounts/{id}/transfers",
	} {
		_, rec, first := kit.RoundTrip(t, srv, "POST", path, `{"qty":1}`)
		if first.Status != http.StatusCreated || rec.Endpoint != endpoint {
			t.Errorf("%s: status %d, endpoint %q, want 201 %q", path, first.Status, rec.Endpoint, endpoint)
		}
	}
	if _, rec, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/rejects", `{"qty":0}`); first.Status != http.StatusBadRequest || rec.Response.Status != http.StatusBadRequest {
		t.Errorf("a handler's 400: client %d, recorded %d", first.Status, rec.Response.Status)
	}

	// A panic: the record is failed and re-raised; the client gets the
	// Recoverer's 500, wherever it sits.
	for _, path := range []string{"/accounts/a1/panics", "/accounts/a1/panics-inside"} {
		key := routertest.Key()
		if got := routertest.Send(t, srv, "POST", path, key, `{}`); got.Status != http.StatusInternalServerError {
			t.Errorf("%s: status %d, want 500", path, got.Status)
		}
		kit.Failed(t, srv, "POST", path, key, `{}`)
	}

	// chi's own answers on the root router: routed nowhere, so never
	// claimed.
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/nowhere", http.StatusNotFound},
		{"PUT", "/accounts/a1/orders", http.StatusMethodNotAllowed},
	} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: chi's own answer was recorded", c.method, c.path)
		}
	}
	// A sub-router's Use runs before the sub-router routes: its 404 and 405
	// pass through the middleware, are recorded and replayed as they were,
	// under the mount's pattern (chi's r.Pattern at that point).
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/v2/accounts/a1/nowhere", http.StatusNotFound},
		{"PUT", "/v2/accounts/a1/orders", http.StatusMethodNotAllowed},
	} {
		_, rec, first := kit.RoundTrip(t, srv, c.method, c.path, `{}`)
		if first.Status != c.status || rec.Endpoint != "/v2/accounts/{id}/*" {
			t.Errorf("%s %s: status %d endpoint %q", c.method, c.path, first.Status, rec.Endpoint)
		}
	}
}

// TestChiRootUse: the middleware on the root router runs before chi routes,
// where r.Pattern is still empty; RouteName still names the route, and a
// keyed request chi answers 404 is recorded and replayed as that 404.
func TestChiRootUse(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{RouteName: idemchi.RouteName})
	r := chi.NewRouter()
	r.Use(kit.MW.MustRoute(idempotency.RouteConfig{}))
	r.Post("/accounts/{id}/orders", created)
	srv := start(t, r)

	if _, rec, _ := kit.RoundTrip(t, srv, "POST", "/accounts/a1/orders", `{}`); rec.Endpoint != "POST /accounts/{id}/orders" {
		t.Errorf("endpoint %q", rec.Endpoint)
	}
	_, rec, first := kit.RoundTrip(t, srv, "POST", "/nowhere", `{}`)
	if first.Status != http.StatusNotFound || rec.Endpoint != "POST /nowhere" {
		t.Errorf("chi's 404: status %d endpoint %q", first.Status, rec.Endpoint)
	}
}

// TestRouteNameOutsideChi: no chi context, no name.
func TestRouteNameOutsideChi(t *testing.T) {
	t.Parallel()
	if got := routertest.RouteNameOf(t, idemchi.RouteName, httptest.NewRequest("POST", "/x", nil)); got != "" {
		t.Fatalf("RouteName = %q outside chi", got)
	}
}
