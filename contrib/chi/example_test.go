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
