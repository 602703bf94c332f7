package main

import (
	"net/http"
	"testing"

	"github.com/idemkit/idempotency/idempotencytest"
)

// TestRouteCoverage proves, from the same table that registers the routes,
// that every route that changes state is wrapped by the idempotency
// middleware (behind the session middleware: the probe is authenticated)
// or exempt with a reason; on PostgreSQL the order route is transactional.
// The probe claims no key and runs no handler: the user has no order
// afterwards.
func TestRouteCoverage(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]backend{"memory": memoryBackend, "postgres": postgresBackend} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := b(t, envOptions{})
			uid, token := e.newUser(t)
			var patterns []string
			exempt := map[string]string{}
			for _, rt := range e.srv.routes {
				patterns = append(patterns, rt.pattern)
				if rt.exempt != "" {
					exempt[rt.pattern] = rt.exempt
				}
			}
			idempotencytest.CheckCoverage(t, e.srv, patterns, exempt, func(r *http.Request) {
				r.Header.Set("Authorization", "Bearer "+token)
			})
			if orders := e.orders(t, token); len(orders) != 0 {
				t.Fatalf("user %d has %d orders after the coverage probe, want 0", uid, len(orders))
			}
		})
	}
}
