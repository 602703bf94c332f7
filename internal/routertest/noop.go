package routertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
)

// Noop serves the HTTP middleware's counterpart of the RPC benchmarks'
// no-op method on a loopback port: POST /plain without the middleware,
// POST /keyed behind a fail-closed ordinary route of mw; both answer 201
// {"ok":true}. It returns the call for a path and a key ("" for none),
// which fails on any other status. contrib/grpc's and contrib/connect's
// benchmarks share it, so their HTTP figures measure the same thing.
func Noop(tb testing.TB, mw *idempotency.Middleware) func(ctx context.Context, path, key string) error {
	tb.Helper()
	noop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /plain", noop)
	mux.Handle("POST /keyed", mw.MustRoute(idempotency.RouteConfig{Name: "noop"})(noop))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	tb.Cleanup(hc.CloseIdleConnections)
	return func(ctx context.Context, path, key string) error {
		req, err := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(`{"amount":10}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("HTTP status %s", http.StatusText(resp.StatusCode))
		}
		return nil
	}
}
