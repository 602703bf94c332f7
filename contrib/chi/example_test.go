package idemchi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/chi"
)

// Wrap a group of chi routes: the group's middleware runs after chi has
// routed, so chi's own 404 and 405 never spend a key; RouteName labels each
// route with its template.
func ExampleRouteName() {
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		RouteName: idemchi.RouteName,
	})
	if err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Group(func(r chi.Router) {
		r.Use(idem.MustRoute(idempotency.RouteConfig{}))
		r.Post("/accounts/{id}/orders", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"account":%q}`, chi.URLParam(r, "id"))
		})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/accounts/a1/orders", strings.NewReader(`{"qty":1}`))
		req.Header.Set("Idempotency-Key", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	// Output:
	// 201  {"account":"a1"}
	// 201 true {"idempotency_replayed":true,"account":"a1"}
}

// List a chi router's routes for idempotencytest.CheckCoverage, and refuse
// a key sent to a route that is not wrapped with RefuseUnlisted and
// Lookup.
func ExampleRoutes() {
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{RouteName: idemchi.RouteName})
	if err != nil {
		panic(err)
	}
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }
	r := chi.NewRouter()
	r.With(idem.MustRoute(idempotency.RouteConfig{})).Post("/accounts/{id}/orders", ok)
	r.Post("/accounts/{id}/notes", ok) // forgotten
	fmt.Println(idemchi.Routes(r))

	h := idempotency.RefuseUnlisted([]string{"POST /accounts/{id}/orders"}, idemchi.Lookup(r))(r)
	req := httptest.NewRequest("POST", "/accounts/a1/notes", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	fmt.Print(w.Code, " ", w.Body)
	// Output:
	// [POST /accounts/{id}/notes POST /accounts/{id}/orders]
	// 400 {"error":"idempotency_key_unsupported"}
}
