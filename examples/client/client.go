package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/idemclient"
	"github.com/idemkit/idempotency/internal/lossyproxy"
)

// run places the orders and checks them; see the package comment.
func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	target, err := url.Parse(o.server)
	if err != nil || target.Host == "" {
		return fmt.Errorf("-server %q is not a URL like http://127.0.0.1:8080", o.server)
	}

	// Straight to the server: creating the demo user is not idempotent,
	// so it is never sent through the proxy or retried.
	direct := &http.Transport{}
	defer direct.CloseIdleConnections()
	plain := &http.Client{Transport: direct, Timeout: 30 * time.Second}
	token, err := newUser(ctx, plain, o.server)
	if err != nil {
		return err
	}

	proxyURL, notes, stop, err := startProxy(target, o)
	if err != nil {
		return err
	}
	defer stop()

	base := &http.Transport{ResponseHeaderTimeout: o.attemptTimeout}
	defer base.CloseIdleConnections()
	var retries []string
	tr := &idemclient.Transport{Base: base, MaxAttempts: 10, OnRetry: func(r idemclient.Retry) {
		what := fmt.Sprintf("%d %s", r.Status, r.Code)
		if r.Err != nil {
			what = shortErr(r.Err)
		}
		retries = append(retries, fmt.Sprintf("attempt %d: %s; again in %v", r.Attempt, strings.TrimSpace(what), r.Wait.Round(time.Millisecond)))
	}}
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	fmt.Fprintf(out, "placing %d orders through a lossy proxy (%s -> %s), faults %.0f%%\n", o.orders, proxyURL, o.server, 100*o.faultRate)
	rng := rand.New(rand.NewPCG(o.seed, 1))
	placed := map[int64]string{} // order id -> key
	for i := 1; i <= o.orders; i++ {
		body := randomOrder(rng)
		key := idemclient.NewKey() // stored with the pending order in a real program
		retries = retries[:0]
		notes.reset()
		res, err := placeOrder(idemclient.WithKey(ctx, key), client, proxyURL, token, body)
		fmt.Fprintf(out, "order %d: %s, key %s\n", i, body, key)
		for _, n := range notes.take() {
			fmt.Fprintf(out, "  proxy:  %s\n", n)
		}
		for _, r := range retries {
			fmt.Fprintf(out, "  client: %s\n", r)
		}
		if err != nil {
			return fmt.Errorf("order %d (key %s): %w", i, key, err)
		}
		replayed := ""
		if res.replayed {
			replayed = " (a replay)"
		}
		fmt.Fprintf(out, "  placed: order #%d%s\n", res.ID, replayed)
		if res.ClientOrderID != key {
			return fmt.Errorf("order %d: the server's client_order_id %q is not the key %q", i, res.ClientOrderID, key)
		}
		placed[res.ID] = key
	}

	listed, err := listOrders(ctx, plain, o.server, token)
	if err != nil {
		return err
	}
	if err := verify(placed, listed); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d orders placed, %d on the server: each placed exactly once\n", len(placed), len(listed))
	return nil
}

// order is the server's answer for one order (the fields this program
// checks).
type order struct {
	ID            int64  `json:"id"`
	ClientOrderID string `json:"client_order_id"`
	replayed      bool
}

var symbols = []string{"AAPL", "MSFT", "NVDA", "AMZN", "GOOG"}

func randomOrder(rng *rand.Rand) string {
	side := "buy"
	if rng.IntN(2) == 1 {
		side = "sell"
	}
	return fmt.Sprintf(`{"symbol":%q,"side":%q,"qty":%d}`, symbols[rng.IntN(len(symbols))], side, 1+rng.IntN(100))
}

// placeOrder posts one order; ctx carries its key.
func placeOrder(ctx context.Context, c *http.Client, base, token, body string) (order, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/api/trading/orders", strings.NewReader(body))
	if err != nil {
		return order{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return order{}, err
	}
	defer resp.Body.Close()
	if e := idemclient.ErrorFrom(resp); e != nil {
		// A typed answer: 409 outcome_unknown would mean "look the order
		// up"; the others are final for this key.
		return order{}, e
	}
	var o order
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return order{}, fmt.Errorf("read the order: %w", err)
	}
	o.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return o, nil
}

// verify checks that the server lists each placed order once and nothing
// else.
func verify(placed map[int64]string, listed []order) error {
	seen := map[int64]int{}
	for _, o := range listed {
		seen[o.ID]++
		if key, ok := placed[o.ID]; !ok {
			return fmt.Errorf("the server has order #%d (key %s), which the client never got", o.ID, o.ClientOrderID)
		} else if o.ClientOrderID != key {
			return fmt.Errorf("order #%d has key %s, want %s", o.ID, o.ClientOrderID, key)
		}
	}
	for id := range placed {
		if seen[id] != 1 {
			return fmt.Errorf("order #%d is on the server %d times, want once", id, seen[id])
		}
	}
	keys := map[string]int64{}
	for _, o := range listed {
		if other, dup := keys[o.ClientOrderID]; dup {
			return fmt.Errorf("orders #%d and #%d were both placed for key %s", other, o.ID, o.ClientOrderID)
		}
		keys[o.ClientOrderID] = o.ID
	}
	return nil
}

func newUser(ctx context.Context, c *http.Client, base string) (string, error) {
	var u struct {
		Token string `json:"token"`
	}
	if err := call(ctx, c, "POST", base+"/api/demo/users", "", `{"name":"idemclient example"}`, http.StatusCreated, &u); err != nil {
		return "", fmt.Errorf("create a demo user: %w", err)
	}
	return u.Token, nil
}

func listOrders(ctx context.Context, c *http.Client, base, token string) ([]order, error) {
	var l struct {
		Orders []order `json:"orders"`
	}
	if err := call(ctx, c, "GET", base+"/api/trading/orders", token, "", http.StatusOK, &l); err != nil {
		return nil, fmt.Errorf("list the orders: %w", err)
	}
	return l.Orders, nil
}

// call sends one request and decodes a JSON answer of status want into v.
func call(ctx context.Context, c *http.Client, method, url, token, body string, want int, v any) error {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return json.Unmarshal(raw, v)
}

// proxyNotes collects what the proxy did for the current order.
type proxyNotes struct {
	mu    sync.Mutex
	notes []string
}

func (p *proxyNotes) add(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notes = append(p.notes, s)
}

func (p *proxyNotes) reset() { p.take() }

func (p *proxyNotes) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.notes
	p.notes = nil
	return n
}

// startProxy starts the lossy proxy on a loopback port. Each request to
// the order route meets a fault with probability o.faultRate.
func startProxy(target *url.URL, o options) (string, *proxyNotes, func(), error) {
	notes := &proxyNotes{}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(o.seed, 2))
	faults := []lossyproxy.Fault{lossyproxy.DropRequest, lossyproxy.DropAnswer, lossyproxy.CutAnswer, lossyproxy.Delay}
	p := &lossyproxy.Proxy{
		Target: target,
		Delay:  o.delay,
		Plan: func(_ int, r *http.Request) lossyproxy.Fault {
			mu.Lock()
			defer mu.Unlock()
			if r.URL.Path != "/api/trading/orders" || rng.Float64() >= o.faultRate {
				return lossyproxy.Pass
			}
			return faults[rng.IntN(len(faults))]
		},
		OnFault: func(_ int, r *http.Request, f lossyproxy.Fault, status int) {
			switch {
			case f == lossyproxy.DropRequest:
				notes.add("dropped the request (the server never saw it)")
			case status == 0 && r.Context().Err() != nil:
				notes.add("forwarded the request; the client gave up before the server answered")
			case status == 0:
				notes.add("forwarded the request; the server did not answer")
			case f == lossyproxy.Pass:
				notes.add(fmt.Sprintf("passed the answer (%d)", status))
			default:
				notes.add(fmt.Sprintf("%s (the server answered %d)", f, status))
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := func() {
		_ = srv.Close()
		<-done
		p.Close()
	}
	return "http://" + ln.Addr().String(), notes, stop, nil
}

// shortErr is the last part of a transport error, without the URL.
func shortErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s)-i < 60 {
		return s[i+2:]
	}
	return s
}
