package exampledoc

import (
	"fmt"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"

	idemopenapi "github.com/idemkit/idempotency/contrib/openapi"
)

// operation is one route of the example server's ServeMux.
type operation struct {
	method, path string
	op           *openapi3.Operation
}

// newOp starts an operation with its id, summary and tag.
func newOp(id, tag, summary string) *openapi3.Operation {
	return &openapi3.Operation{OperationID: id, Tags: []string{tag}, Summary: summary, Responses: openapi3.NewResponses()}
}

// jsonResponse answers schema as application/json.
func jsonResponse(op *openapi3.Operation, status int, desc string, schema *openapi3.SchemaRef) *openapi3.Response {
	r := openapi3.NewResponse().WithDescription(desc).WithJSONSchemaRef(schema)
	op.Responses.Set(fmt.Sprint(status), &openapi3.ResponseRef{Value: r})
	return r
}

// errorResponse answers the example's own {"error": ...}.
func errorResponse(op *openapi3.Operation, status int, desc string) *openapi3.Response {
	return jsonResponse(op, status, desc, ref("Error"))
}

// public marks op as needing no session.
func public(op *openapi3.Operation) { op.Security = &openapi3.SecurityRequirements{} }

// jsonBody is a JSON request body.
func jsonBody(schema string, required bool) *openapi3.RequestBodyRef {
	b := openapi3.NewRequestBody().WithJSONSchemaRef(ref(schema))
	b.Required = required
	return &openapi3.RequestBodyRef{Value: b}
}

// idParam is the {id} path parameter.
func idParam() *openapi3.ParameterRef {
	return &openapi3.ParameterRef{Value: openapi3.NewPathParameter("id").WithSchema(openapi3.NewInt64Schema().WithMin(1))}
}

// operations are the example's routes, each declared as its handler answers,
// with the idempotency contract added to the two wrapped ones.
func operations() ([]operation, error) {
	createUser := newOp("createDemoUser", "demo", "Create a demo account and its bearer token")
	public(createUser)
	createUser.RequestBody = jsonBody("UserRequest", false)
	jsonResponse(createUser, http.StatusCreated, "The account and its token.", ref("User"))
	errorResponse(createUser, http.StatusBadRequest, "invalid_user: the body is not a valid UserRequest.")
	errorResponse(createUser, http.StatusRequestEntityTooLarge, "body_too_large: the body is over 1 MiB.")
	errorResponse(createUser, http.StatusServiceUnavailable, "database_unavailable.").Headers = retryAfter()

	placeOrder, err := placeOrder()
	if err != nil {
		return nil, err
	}
	createSession, err := createCheckoutSession()
	if err != nil {
		return nil, err
	}

	listOrders, getOrder, cancelOrder := orderReads()
	listSessions := newOp("listCheckoutSessions", "billing", "List the user's checkout sessions")
	jsonResponse(listSessions, http.StatusOK, "The user's checkout sessions.", listOf("checkout_sessions", "CheckoutSession"))
	unauthorized(listSessions)
	metrics, healthz, document := operationsRoutes()

	return []operation{
		{http.MethodPost, "/api/demo/users", createUser},
		{http.MethodPost, "/api/trading/orders", placeOrder},
		{http.MethodGet, "/api/trading/orders", listOrders},
		{http.MethodGet, "/api/trading/orders/{id}", getOrder},
		{http.MethodDelete, "/api/trading/orders/{id}", cancelOrder},
		{http.MethodPost, "/api/billing/checkout-sessions", createSession},
		{http.MethodGet, "/api/billing/checkout-sessions", listSessions},
		{http.MethodGet, "/metrics", metrics},
		{http.MethodGet, "/healthz", healthz},
		{http.MethodGet, "/openapi.json", document},
	}, nil
}

// placeOrder is POST /api/trading/orders: the handler's answers, then the
// fail-closed route's contract.
func placeOrder() (*openapi3.Operation, error) {
	op := newOp("placeOrder", "trading", "Place a paper order (at most once per Idempotency-Key)")
	op.Description = "Tier 1: fail-closed, keys remembered for 24 hours; on PostgreSQL and MariaDB the order, its audit row and the key's record commit in one transaction."
	op.RequestBody = jsonBody("OrderRequest", true)
	created := jsonResponse(op, http.StatusCreated, "The order, filled.", ref("Order"))
	created.Headers = openapi3.Headers{"Location": {Value: &openapi3.Header{Parameter: openapi3.Parameter{
		Description: "/api/trading/orders/{id}", Required: true, Schema: openapi3.NewStringSchema().NewRef(),
	}}}}
	errorResponse(op, http.StatusBadRequest, "invalid_order: the body is not a valid OrderRequest (message says why).")
	unauthorized(op)
	errorResponse(op, http.StatusRequestEntityTooLarge, "body_too_large: the body is over 1 MiB.")
	errorResponse(op, http.StatusInternalServerError, "fill_engine_error: the fill failed and nothing was written (symbol XFAIL simulates it).")
	errorResponse(op, http.StatusServiceUnavailable, "new_orders_disabled (the order-path kill-switch, before the idempotency middleware) or database_unavailable.")
	errorResponse(op, http.StatusGatewayTimeout, "fill_timeout: the order outlived its deadline.")
	if err := idemopenapi.Operation(op, config, ordersRoute); err != nil {
		return nil, err
	}
	return op, nil
}

// createCheckoutSession is POST /api/billing/checkout-sessions: the
// handler's answers, then the fail-open route's contract.
func createCheckoutSession() (*openapi3.Operation, error) {
	op := newOp("createCheckoutSession", "billing", "Create a checkout session (at most once per Idempotency-Key)")
	op.Description = "Tier 2: fail-open, keys remembered for 7 days; the fake provider also deduplicates on the key, as Stripe does."
	op.RequestBody = jsonBody("CheckoutSessionRequest", true)
	jsonResponse(op, http.StatusCreated, "The checkout session.", ref("CheckoutSession"))
	errorResponse(op, http.StatusBadRequest, "invalid_checkout_session: the body is not a valid CheckoutSessionRequest.")
	unauthorized(op)
	errorResponse(op, http.StatusRequestEntityTooLarge, "body_too_large: the body is over 1 MiB.")
	errorResponse(op, http.StatusUnprocessableEntity, "idempotency_key_body_mismatch from the provider, when the middleware was bypassed.")
	if err := idemopenapi.Operation(op, config, billingRoute); err != nil {
		return nil, err
	}
	return op, nil
}

// unauthorized declares the session middleware's 401.
func unauthorized(op *openapi3.Operation) {
	errorResponse(op, http.StatusUnauthorized, "unauthorized: no valid bearer token.")
}

// retryAfter declares the example's own Retry-After: 1.
func retryAfter() openapi3.Headers {
	return openapi3.Headers{"Retry-After": {Value: &openapi3.Header{Parameter: openapi3.Parameter{
		Description: "Seconds to wait before retrying.", Required: true, Schema: openapi3.NewIntegerSchema().NewRef(),
	}}}}
}

// listOf is {"<member>": [<schema>...]}.
func listOf(member, schema string) *openapi3.SchemaRef {
	s := openapi3.NewObjectSchema().WithProperty(member, openapi3.NewArraySchema().WithItems(nil))
	s.Properties[member].Value.Items = ref(schema)
	s.Required = []string{member}
	return s.NewRef()
}

// orderReads are the order routes that are not wrapped: GET the list, GET
// and DELETE one order.
func orderReads() (listOrders, getOrder, cancelOrder *openapi3.Operation) {
	listOrders = newOp("listOrders", "trading", "List the user's orders, oldest first")
	jsonResponse(listOrders, http.StatusOK, "The user's orders.", listOf("orders", "Order"))
	unauthorized(listOrders)
	errorResponse(listOrders, http.StatusServiceUnavailable, "database_unavailable.").Headers = retryAfter()

	getOrder = newOp("getOrder", "trading", "Get one of the user's orders")
	getOrder.Parameters = openapi3.Parameters{idParam()}
	jsonResponse(getOrder, http.StatusOK, "The order.", ref("Order"))
	unauthorized(getOrder)
	errorResponse(getOrder, http.StatusNotFound, "not_found: not the user's order, or no such id.")
	errorResponse(getOrder, http.StatusServiceUnavailable, "database_unavailable.").Headers = retryAfter()

	cancelOrder = newOp("cancelOrder", "trading", "Cancel an order (orders fill at once, so never cancellable)")
	cancelOrder.Description = "Already idempotent, so not wrapped: the user's own order answers 409 order_not_cancellable every time."
	cancelOrder.Parameters = openapi3.Parameters{idParam()}
	notCancellable := openapi3.NewObjectSchema().
		WithProperty("error", openapi3.NewStringSchema().WithEnum("order_not_cancellable")).
		WithProperty("status", openapi3.NewStringSchema())
	notCancellable.Required = []string{"error", "status"}
	jsonResponse(cancelOrder, http.StatusConflict, "order_not_cancellable: the order is filled.", notCancellable.NewRef())
	unauthorized(cancelOrder)
	errorResponse(cancelOrder, http.StatusNotFound, "not_found: not the user's order, or no such id.")
	errorResponse(cancelOrder, http.StatusServiceUnavailable, "database_unavailable.").Headers = retryAfter()

	return listOrders, getOrder, cancelOrder
}

// operationsRoutes are GET /metrics, /healthz and /openapi.json: no session.
func operationsRoutes() (metrics, healthz, document *openapi3.Operation) {
	metrics = newOp("metrics", "operations", "Prometheus metrics")
	public(metrics)
	text := openapi3.NewResponse().WithDescription("The server's metrics in the Prometheus text format.").
		WithContent(openapi3.NewContentWithSchema(openapi3.NewStringSchema(), []string{"text/plain"}))
	metrics.Responses.Set("200", &openapi3.ResponseRef{Value: text})

	healthz = newOp("healthz", "operations", "Liveness (does not touch the database)")
	public(healthz)
	jsonResponse(healthz, http.StatusOK, "The server is up.",
		openapi3.NewObjectSchema().WithProperty("status", openapi3.NewStringSchema().WithEnum("ok")).NewRef())

	document = newOp("openapi", "operations", "This OpenAPI document")
	public(document)
	jsonResponse(document, http.StatusOK, "The example server's OpenAPI 3.0.3 document.", openapi3.NewObjectSchema().NewRef())

	return metrics, healthz, document
}
