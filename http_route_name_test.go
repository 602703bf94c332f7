package idempotency_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkit/idempotency"
)

// TestRouteName: Config.RouteName names a route when RouteConfig.Name is
// empty, before r.Pattern; its "" falls through to r.Pattern. The name is
// the key's scope_endpoint and the metrics label.
func TestRouteName(t *testing.T) {
	t.Parallel()
	store := idempotency.NewMemoryStore()
	reg := prometheus.NewRegistry()
	mw, err := idempotency.New(store, idempotency.Config{
		RouteName: func(ctx context.Context) string {
			r, _ := idempotency.RequestFromContext(ctx)
			return r.Header.Get("X-Template")
		},
		Enabled:    func(context.Context) bool { return true },
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{account}", mw.MustRoute(idempotency.RouteConfig{})(ok))
	named := mw.MustRoute(idempotency.RouteConfig{Name: "explicit"})(ok)
	send := func(h http.Handler, path, key, template string) {
		r := httptest.NewRequest("POST", path, strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, key)
		if template != "" {
			r.Header.Set("X-Template", template)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	send(mux, "/orders/1", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b", "POST /tmpl/{id}")
	send(mux, "/orders/2", "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "")
	send(named, "/x", "3f0b7c6e-2a4d-4e8f-9b1a-0c2d3e4f5a6b", "ignored")

	rows, err := store.ExportScope(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []string
	for _, r := range rows {
		endpoints = append(endpoints, r.Endpoint)
	}
	if got := strings.Join(endpoints, "|"); got != "POST /tmpl/{id}|POST /orders/{account}|explicit" {
		t.Fatalf("stored endpoints %q", got)
	}
	const want = `
# HELP idempotency_miss_total Requests that claimed their key (new, expired takeover).
# TYPE idempotency_miss_total counter
idempotency_miss_total{endpoint="POST /orders/{account}"} 1
idempotency_miss_total{endpoint="POST /tmpl/{id}"} 1
idempotency_miss_total{endpoint="explicit"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idempotency_miss_total"); err != nil {
		t.Fatal(err)
	}
}
