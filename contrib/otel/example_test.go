package idemotel_test

import (
	"log"
	"net/http"

	"github.com/idemkit/idempotency"
	idemotel "github.com/idemkit/idempotency/contrib/otel"
)

// Report every decision to OpenTelemetry. Wrap the mux in otelhttp (or
// any handler that puts the request's span in its context) so the
// attributes land on the request's span.
func Example() {
	obs, err := idemotel.New(idemotel.Config{}) // the global MeterProvider
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.MustRoute(idempotency.RouteConfig{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	_ = mux // http.ListenAndServe(addr, otelhttp.NewHandler(mux, "api"))
}
