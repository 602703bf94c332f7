package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemclient"
	"github.com/idemkit/idempotency/internal/lossyproxy"
)

// TestClientRetriesACutBody: the middleware, a proxy that cuts the first
// answer mid-body, and idemclient's Transport in front. The order runs
// once; the client's retry (same key, same body) gets its replay, whole.
// Before, the client returned the first answer and its read failed with
// an unexpected EOF: a caller that then retried with a new key, or not at
// all, could not tell whether the order was placed.
func TestClientRetriesACutBody(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{Logger: quiet,
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	fills := strings.Repeat("f", 8000)
	srv := httptest.NewServer(mw.MustRoute(idempotency.RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"fills":%q}`, n, fills)
	})))
	defer srv.Close()
	target, _ := url.Parse(srv.URL)
	var faults atomic.Int64
	proxy := &lossyproxy.Proxy{Target: target, Plan: func(int, *http.Request) lossyproxy.Fault {
		if faults.Add(1) == 1 {
			return lossyproxy.CutBody
		}
		return lossyproxy.Pass
	}}
	defer proxy.Close()
	ps := httptest.NewServer(proxy)
	defer ps.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: &idemclient.Transport{Base: base, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ps.URL+"/orders", strings.NewReader(`{"qty":1}`))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("the client gave up: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`{"idempotency_replayed":true,"order":1,"fills":%q}`, fills)
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get(idempotency.HeaderReplayed) != "true" || string(body) != want {
		t.Fatalf("answer %d (replayed %q), %d bytes, read error %v; want the whole replay of order 1",
			resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), len(body), err)
	}
	if calls.Load() != 1 || faults.Load() != 2 {
		t.Fatalf("%d executions over %d requests; want 1 over 2", calls.Load(), faults.Load())
	}
}
