package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemclient"
)

// orderServer is a server with an order route behind the middleware (in
// memory); placed counts the orders the handler placed.
func orderServer(placed *atomic.Int32) *httptest.Server {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.Config{})
	if err != nil {
		panic(err)
	}
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := placed.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"filled"}`, id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.MustRoute(idempotency.RouteConfig{})(placeOrder))
	return httptest.NewServer(mux)
}

// losesAnswers is a network that loses the first n answers after the
// server has sent them: the order is placed, the client does not know.
type losesAnswers struct {
	n    atomic.Int32
	base http.RoundTripper
}

func (l *losesAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err == nil && l.n.Add(-1) >= 0 {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

// The Transport sends each request with a key and retries it where the
// contract makes that safe: here the first answer is lost after the order
// was placed, and the retry, with the same key and body, gets the replay.
func ExampleTransport() {
	var placed atomic.Int32
	srv := orderServer(&placed)
	defer srv.Close()

	network := &losesAnswers{base: http.DefaultTransport}
	network.n.Store(1)
	client := &http.Client{Transport: &idemclient.Transport{Base: network}}

	resp, err := client.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"symbol":"AAPL","qty":10}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	fmt.Println("orders placed:", placed.Load())
	// Output:
	// 201 true {"id":1,"status":"filled","idempotency_replayed":true}
	// orders placed: 1
}

// A key chosen by the caller for one logical operation outlives the
// Transport's retries: store it with the pending order before the first
// attempt, and send the stored key again later (after a restart, from
// another process). A key reused for another order is refused (422).
func ExampleWithKey() {
	var placed atomic.Int32
	srv := orderServer(&placed)
	defer srv.Close()

	network := &losesAnswers{base: http.DefaultTransport}
	network.n.Store(3)
	client := &http.Client{Transport: &idemclient.Transport{Base: network, MaxAttempts: 3}}
	order := func(ctx context.Context, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/orders", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return client.Do(req)
	}

	key := idemclient.NewKey() // stored with the pending order
	ctx := idemclient.WithKey(context.Background(), key)
	if _, err := order(ctx, `{"symbol":"AAPL","qty":10}`); err != nil {
		fmt.Println("no answer after 3 attempts; the order stays pending")
	}

	// Later: the pending order is sent again with its stored key.
	resp, err := order(ctx, `{"symbol":"AAPL","qty":10}`)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("pending order sent again:", resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed"))

	// The same key for another order: a typed error, not retried.
	resp, err = order(ctx, `{"symbol":"AAPL","qty":11}`)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	if e := idemclient.ErrorFrom(resp); e != nil && e.Code == idemclient.CodeKeyBodyMismatch {
		fmt.Println("key reused:", e)
	}
	fmt.Println("orders placed:", placed.Load())
	// Output:
	// no answer after 3 attempts; the order stays pending
	// pending order sent again: 201 replayed: true
	// key reused: idemclient: status 422: idempotency_key_body_mismatch
	// orders placed: 1
}
