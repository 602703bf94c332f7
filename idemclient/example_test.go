package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idempotency/idemclient"
)

// orderServer stands in for a server with the idempotency middleware in
// front of an order route (the example's tests import only the standard
// library, so that a program importing idemclient never needs the
// middleware's dependencies): a key's first request places the order, the
// same key and body again replay its answer, another body is a 422.
// placed counts the orders placed.
func orderServer(placed *atomic.Int32) *httptest.Server {
	var mu sync.Mutex
	type record struct{ body, answer string }
	records := map[string]record{}
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		rec, seen := records[key]
		switch {
		case seen && rec.body != string(body):
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"error":"idempotency_key_body_mismatch"}`)
			return
		case seen:
			w.Header().Set("Idempotent-Replayed", "true")
		default:
			rec = record{string(body), fmt.Sprintf(`{"id":%d,"status":"filled"}`, placed.Add(1))}
			records[key] = rec
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, rec.answer)
	}))
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
	// 201 true {"id":1,"status":"filled"}
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
