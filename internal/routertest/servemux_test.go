package routertest_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/routertest"
)

// TestServeMux is the ServeMux recipe on a real server: each route is
// wrapped where it is registered, so r.Pattern names it; the mux's own 404
// and 405 never reach the middleware; a panic is recorded as failed.
func TestServeMux(t *testing.T) {
	t.Parallel()
	kit := routertest.New(t, idempotency.Config{})
	orders := kit.MW.MustRoute(idempotency.RouteConfig{})
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/accounts/"+r.PathValue("id")+"/orders/7")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":7}`))
	})))
	mux.Handle("POST /accounts/{id}/panics", orders(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	})))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
	srv.Start()
	t.Cleanup(srv.Close)

	_, rec, first := kit.RoundTrip(t, srv, "POST", "/accounts/a1/orders", `{"qty":1}`)
	if first.Status != http.StatusCreated || rec.Endpoint != "POST /accounts/{id}/orders" {
		t.Fatalf("status %d endpoint %q", first.Status, rec.Endpoint)
	}

	// net/http recovers the panic and drops the connection; its Transport
	// retries a request with an Idempotency-Key on its own, which gets the
	// failed key's 409.
	key := routertest.Key()
	req, _ := http.NewRequest("POST", srv.URL+"/accounts/a1/panics", nil)
	req.Header.Set(idempotency.HeaderKey, key)
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict {
			t.Fatalf("a panicking handler answered %d", resp.StatusCode)
		}
	}
	kit.Failed(t, srv, "POST", "/accounts/a1/panics", key, "")

	for _, c := range []struct {
		method, path string
		status       int
	}{{"POST", "/nowhere", http.StatusNotFound}, {"PUT", "/accounts/a1/orders", http.StatusMethodNotAllowed}} {
		before := kit.Rows(t)
		if got := routertest.Send(t, srv, c.method, c.path, routertest.Key(), `{}`); got.Status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got.Status, c.status)
		}
		if kit.Rows(t) != before {
			t.Errorf("%s %s: the mux's own answer was recorded", c.method, c.path)
		}
	}
}
