// Package exampledoc builds the OpenAPI document of the example server
// (examples/server), which embeds it as openapi.json and serves it at
// GET /openapi.json. The example lives in the root module, which must not
// require kin-openapi, so the document is generated here and committed:
// TestExampleDocumentIsCurrent fails when the committed file differs, and
// `go run ./cmd/exampledoc > ../../examples/server/openapi.json` (in
// contrib/openapi) rewrites it.
package exampledoc

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemkit/idempotency"
)

// The example server's idempotency configuration (examples/server/server.go):
// keys scoped by the session's user, the default error format.
var (
	config = idempotency.Config{Scope: func(context.Context) string { return "" }}
	// Tier 1: fail-closed, 24h, transactional on PostgreSQL and MariaDB
	// (in memory it is not, and never answers its 500).
	ordersRoute = idempotency.RouteConfig{TTL: 24 * time.Hour, Transactional: true}
	// Tier 2: fail-open, 7 days.
	billingRoute = idempotency.RouteConfig{TTL: 7 * 24 * time.Hour, FailOpen: true} // the example server's billing route
)

// The example's own limits (examples/server/orders.go, billing.go).
const (
	maxQty       = 1_000_000
	symbolRegexp = `^[A-Z][A-Z0-9.]{0,9}$`
)

var plans = []any{"basic", "pro", "team"}

// Document returns the example server's document, loaded from JSON's bytes
// (so its $refs are resolved) and validated.
func Document() (*openapi3.T, error) {
	b, err := JSON()
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		return nil, fmt.Errorf("exampledoc: load the document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("exampledoc: the document is not valid: %w", err)
	}
	return doc, nil
}

// JSON returns the document as the example server serves it: indented,
// with a final newline.
func JSON() ([]byte, error) {
	doc := &openapi3.T{
		OpenAPI: "3.0.3",
		Info: &openapi3.Info{
			Title:       "idempotency example server: a paper-trading API",
			Version:     "1.0.0",
			Description: "The example server of github.com/idemkit/idempotency. POST /api/trading/orders (fail-closed) and POST /api/billing/checkout-sessions (fail-open) are wrapped by the idempotency middleware: send an Idempotency-Key and retry with the same key.",
			License:     &openapi3.License{Name: "MIT", URL: "https://github.com/idemkit/idempotency/blob/main/LICENSE"},
		},
		Servers: openapi3.Servers{{URL: "http://127.0.0.1:8080", Description: "go run ./examples/server"}},
		Tags: openapi3.Tags{
			{Name: "demo", Description: "Demo accounts."},
			{Name: "trading", Description: "Paper orders: they fill at once."},
			{Name: "billing", Description: "Checkout sessions of a fake, in-memory billing provider."},
			{Name: "operations", Description: "Health, metrics and this document."},
		},
		Components: &openapi3.Components{
			Schemas:         schemas(),
			SecuritySchemes: openapi3.SecuritySchemes{"session": {Value: openapi3.NewJWTSecurityScheme().WithBearerFormat("HMAC-signed user id")}},
		},
		Security: openapi3.SecurityRequirements{{"session": {}}},
		Paths:    openapi3.NewPaths(),
	}
	doc.Components.SecuritySchemes["session"].Value.Description = "The token of POST /api/demo/users."
	ops, err := operations()
	if err != nil {
		return nil, err
	}
	for _, o := range ops {
		item := doc.Paths.Value(o.path)
		if item == nil {
			item = &openapi3.PathItem{}
			doc.Paths.Set(o.path, item)
		}
		item.SetOperation(o.method, o.op)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ref is a reference to a component schema.
func ref(name string) *openapi3.SchemaRef {
	return openapi3.NewSchemaRef("#/components/schemas/"+name, nil)
}

// schemas are the example's own bodies.
func schemas() openapi3.Schemas {
	replayed := openapi3.NewBoolSchema().WithEnum(true)
	replayed.Description = "Present, true, on a replay (Idempotent-Replayed: true)."
	order := openapi3.NewObjectSchema().
		WithProperty("id", openapi3.NewInt64Schema()).
		WithProperty("symbol", openapi3.NewStringSchema()).
		WithProperty("side", openapi3.NewStringSchema().WithEnum("buy", "sell")).
		WithProperty("qty", openapi3.NewInt64Schema()).
		WithProperty("status", openapi3.NewStringSchema().WithEnum("filled")).
		WithProperty("fill_price", openapi3.NewFloat64Schema()).
		WithProperty("client_order_id", openapi3.NewStringSchema()).
		WithProperty("created_at", openapi3.NewDateTimeSchema()).
		WithProperty("idempotency_replayed", replayed)
	order.Required = []string{"id", "symbol", "side", "qty", "status", "fill_price", "created_at"}
	order.Properties["client_order_id"].Value.Description = "The Idempotency-Key the order was placed with, when there was one."

	orderRequest := openapi3.NewObjectSchema().
		WithProperty("symbol", openapi3.NewStringSchema().WithPattern(symbolRegexp)).
		WithProperty("side", openapi3.NewStringSchema().WithEnum("buy", "sell")).
		WithProperty("qty", openapi3.NewInt64Schema().WithMin(1).WithMax(maxQty))
	orderRequest.Required = []string{"symbol", "side", "qty"}
	orderRequest.AdditionalProperties = openapi3.AdditionalProperties{Has: new(false)}

	session := openapi3.NewObjectSchema().
		WithProperty("id", openapi3.NewStringSchema().WithPattern(`^cs_`)).
		WithProperty("plan", openapi3.NewStringSchema().WithEnum(plans...)).
		WithProperty("status", openapi3.NewStringSchema()).
		WithProperty("url", openapi3.NewStringSchema().WithFormat("uri")).
		WithProperty("created_at", openapi3.NewDateTimeSchema()).
		WithProperty("idempotency_replayed", replayed)
	session.Required = []string{"id", "plan", "status", "url", "created_at"}

	sessionRequest := openapi3.NewObjectSchema().WithProperty("plan", openapi3.NewStringSchema().WithEnum(plans...))
	sessionRequest.Required = []string{"plan"}
	sessionRequest.AdditionalProperties = openapi3.AdditionalProperties{Has: new(false)}

	userRequest := openapi3.NewObjectSchema().WithProperty("name", openapi3.NewStringSchema().WithMaxLength(100))
	userRequest.AdditionalProperties = openapi3.AdditionalProperties{Has: new(false)}
	user := openapi3.NewObjectSchema().
		WithProperty("user_id", openapi3.NewInt64Schema()).
		WithProperty("name", openapi3.NewStringSchema()).
		WithProperty("token", openapi3.NewStringSchema())
	user.Required = []string{"user_id", "name", "token"}

	errSchema := openapi3.NewObjectSchema().
		WithProperty("error", openapi3.NewStringSchema()).
		WithProperty("message", openapi3.NewStringSchema())
	errSchema.Required = []string{"error"}
	errSchema.Description = "Every error the example's own handlers answer: a code and, on a refused body, a message."

	return openapi3.Schemas{
		"Order":                  order.NewRef(),
		"OrderRequest":           orderRequest.NewRef(),
		"CheckoutSession":        session.NewRef(),
		"CheckoutSessionRequest": sessionRequest.NewRef(),
		"UserRequest":            userRequest.NewRef(),
		"User":                   user.NewRef(),
		"Error":                  errSchema.NewRef(),
	}
}
