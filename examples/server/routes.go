package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// route is one row of the server's route table. The same rows register the
// routes (newServer) and are checked for idempotency coverage
// (TestRouteCoverage), so a route that changes state is either wrapped by
// the idempotency middleware or says here why it need not be.
type route struct {
	pattern string       // "METHOD /path", as http.ServeMux reads it
	handler http.Handler // with its middleware, outermost first
	// exempt says why a route that changes state takes no idempotency
	// key; "" for a wrapped route or a safe method (GET).
	exempt string
}

// routeTable returns the server's routes, orders and billing wrapped by
// their idempotency routes. Add a route here and nowhere else.
func (s *server) routeTable(orders, billing func(http.Handler) http.Handler) []route {
	authed := s.requireSession
	return []route{
		{pattern: "POST /api/demo/users", handler: http.HandlerFunc(s.createUser),
			exempt: "its answer carries a bearer token, which must never be stored for replay; no money moves"},
		// Order of wrapping, outermost first: session, gate, idempotency.
		// The gate can never be bypassed by a replay.
		{pattern: "POST /api/trading/orders", handler: authed(s.newOrdersGate(orders(s.orderHandler())))},
		{pattern: "GET /api/trading/orders", handler: authed(http.HandlerFunc(s.listOrders))},
		{pattern: "GET /api/trading/orders/{id}", handler: authed(http.HandlerFunc(s.getOrder))},
		{pattern: "DELETE /api/trading/orders/{id}", handler: authed(http.HandlerFunc(s.cancelOrder)),
			exempt: "already idempotent: orders fill at once, so every cancel gets the same answer and changes nothing"},
		{pattern: "POST /api/billing/checkout-sessions", handler: authed(billing(http.HandlerFunc(s.createCheckoutSession)))},
		{pattern: "GET /api/billing/checkout-sessions", handler: authed(http.HandlerFunc(s.listCheckoutSessions))},
		{pattern: "GET /metrics", handler: promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})},
		{pattern: "GET /healthz", handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})},
		{pattern: "GET /openapi.json", handler: http.HandlerFunc(serveOpenAPI)},
	}
}
