package idemgorilla_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gorilla/mux"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/contrib/gorilla"
)

// Wrap a gorilla/mux sub-router: its middleware runs only after a route
// matched, and RouteName labels each route with its path template.
func ExampleRouteName() {
	idem, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{
		RouteName: idemgorilla.RouteName,
	})
	if err != nil {
		panic(err)
	}
	r := mux.NewRouter()
	api := r.PathPrefix("/accounts/{id}").Subrouter()
	api.Use(idem.MustRoute(idempotency.RouteConfig{}))
	api.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"account":%q}`, mux.Vars(r)["id"])
	}).Methods("POST")

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
