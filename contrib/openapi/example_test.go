package idemopenapi_test

import (
	"context"
	"fmt"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idemkit/idempotency"
	idemopenapi "github.com/idemkit/idempotency/contrib/openapi"
)

// Declare the handler's own responses, then the route's contract: the
// same Config and RouteConfig as the middleware's.
func ExampleOperation() {
	cfg := idempotency.Config{ErrorFormat: idempotency.ErrorProblem}
	rc := idempotency.RouteConfig{RequireKey: true}

	op := &openapi3.Operation{OperationID: "createPayment", Responses: openapi3.NewResponses()}
	op.Responses.Set("201", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("The payment.")})
	if err := idemopenapi.Operation(op, cfg, rc); err != nil {
		panic(err)
	}
	doc := &openapi3.T{OpenAPI: "3.0.3", Info: &openapi3.Info{Title: "payments", Version: "1"}, Paths: openapi3.NewPaths()}
	doc.Paths.Set("/payments", &openapi3.PathItem{Post: op})
	if err := doc.Validate(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println(op.Parameters[0].Value.Name, op.Parameters[0].Value.Required)
	fmt.Println(op.Responses.Keys())
	fmt.Println(op.Responses.Value("409").Value.Content.Get("application/problem+json") != nil)
	// Output:
	// Idempotency-Key true
	// [201 400 409 413 422 503]
	// true
}
