package downstream_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
)

// placeOrder stands for a broker's order API, which deduplicates orders
// by their client_order_id.
func placeOrder(ctx context.Context, clientOrderID string) error { return nil }

// An order handler sends the broker an id derived from the request's
// idempotency key: every retry and every takeover of the key sends the
// same client_order_id, so the broker books the order once.
func ExampleKey() {
	// IDEMPOTENCY_DERIVE_KEYS=ID:BASE64KEY,... (openssl rand -base64 32),
	// the first active; here a fixed key for the example.
	keys, err := downstream.ParseKeys("k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{DeriveKeys: keys, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	orders := mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := downstream.Key(r.Context(), "broker", "entry", downstream.Alpaca)
		switch {
		case errors.Is(err, downstream.ErrNoKey):
			http.Error(w, "send an Idempotency-Key", http.StatusBadRequest)
			return
		case err != nil: // ErrKeyRetired among them: never call the broker
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := placeOrder(r.Context(), id); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Println("client_order_id has", len(id), "characters")
		w.WriteHeader(http.StatusCreated)
	}))

	r := httptest.NewRequest("POST", "/orders", nil)
	r.Header.Set(idempotency.HeaderKey, "0b6f3c1e-9a2d-4e7f-8c5b-3d1a2e4f6a8b")
	orders.ServeHTTP(httptest.NewRecorder(), r)
	// Output: client_order_id has 43 characters
}
