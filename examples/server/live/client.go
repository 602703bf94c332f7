// Package live is the example server's live mode: its orders go to a venue
// that speaks the retail-broker subset of DESIGN-settled-r4.md item 32
// (examples/venue is one), each under a client_order_id derived from the
// request's idempotency key, so a retry, a takeover or another process sends
// the same id and a venue that deduplicates books the order once.
//
// Client places and looks up orders and classifies every answer: an order,
// a definite refusal (*RejectedError), a duplicate id (ErrDuplicate), no
// such order (ErrNotFound), or an unknown outcome (ErrUnknown: a timeout,
// a dropped connection, a 5xx, any other answer). Handler is the order
// route's handler and Reconcile its reconcile hook; the example server and
// examples/venue's tests build their order routes from them.
//
// It is an example's package, not part of the library's API.
package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The venue's codes this package reads (settled item 32).
const (
	codeDuplicate = 40010001
	codeNotFound  = 40410000
)

var (
	// ErrDuplicate is the venue's refusal of a client_order_id it holds
	// already: 422 code 40010001. Nothing was booked by that request.
	ErrDuplicate = errors.New("venue: client_order_id already booked")
	// ErrNotFound is the venue's 404 code 40410000 to a lookup.
	ErrNotFound = errors.New("venue: order not found")
	// ErrUnknown wraps every answer that does not say whether the venue
	// booked the order: a timeout, a dropped connection, a 5xx, a body that
	// does not parse, any status the wire format does not name.
	ErrUnknown = errors.New("venue: outcome unknown")
)

// RejectedError is the venue's definite refusal of an order: a 4xx other
// than a duplicate client_order_id. Nothing was booked.
type RejectedError struct {
	Status  int
	Code    int
	Message string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("venue: order rejected: %d code %d: %s", e.Status, e.Code, e.Message)
}

// Order is the venue's order (settled item 32).
type Order struct {
	ID             string `json:"id"`
	ClientOrderID  string `json:"client_order_id"`
	Symbol         string `json:"symbol"`
	Qty            string `json:"qty"`
	Side           string `json:"side"`
	Status         string `json:"status"`
	FilledQty      string `json:"filled_qty"`
	FilledAvgPrice string `json:"filled_avg_price"`
	CreatedAt      string `json:"created_at"`
	FilledAt       string `json:"filled_at"`
}

// FillPrice is the order's filled_avg_price as a number.
func (o Order) FillPrice() (float64, error) {
	p, err := strconv.ParseFloat(o.FilledAvgPrice, 64)
	if err != nil {
		return 0, fmt.Errorf("venue: filled_avg_price %q: %w", o.FilledAvgPrice, err)
	}
	return p, nil
}

// Request is an order as the example's client sends it, validated.
type Request struct {
	Symbol string
	Side   string
	Qty    int64
}

// DefaultTimeout bounds each venue call whose context has no earlier
// deadline.
const DefaultTimeout = 10 * time.Second

// Client talks to a venue.
type Client struct {
	// URL is the venue's base URL, e.g. http://127.0.0.1:8090.
	URL string
	// KeyID and SecretKey, when set, go as the APCA-API-KEY-ID and
	// APCA-API-SECRET-KEY headers.
	KeyID, SecretKey string
	// HTTP sends the calls. Defaults to a client with DefaultTimeout.
	HTTP *http.Client
}

// Place sends the order under clientOrderID: the venue's order, or an error
// that is ErrDuplicate, a *RejectedError or ErrUnknown.
func (c *Client) Place(ctx context.Context, clientOrderID string, r Request) (Order, error) {
	body, err := json.Marshal(map[string]string{
		"symbol": r.Symbol, "qty": strconv.FormatInt(r.Qty, 10), "side": r.Side,
		"type": "market", "time_in_force": "day", "client_order_id": clientOrderID,
	})
	if err != nil {
		return Order{}, err
	}
	status, code, o, err := c.call(ctx, http.MethodPost, "/v2/orders", bytes.NewReader(body))
	switch {
	case err != nil:
		return Order{}, err
	case status == http.StatusOK:
		return o, nil
	case status == http.StatusUnprocessableEntity && code.Code == codeDuplicate:
		return Order{}, ErrDuplicate
	case status >= 400 && status < 500:
		return Order{}, &RejectedError{Status: status, Code: code.Code, Message: code.Message}
	}
	return Order{}, fmt.Errorf("%w: POST /v2/orders answered %d", ErrUnknown, status)
}

// Lookup finds the order booked under clientOrderID: the order, ErrNotFound,
// or ErrUnknown.
func (c *Client) Lookup(ctx context.Context, clientOrderID string) (Order, error) {
	path := "/v2/orders:by_client_order_id?client_order_id=" + url.QueryEscape(clientOrderID)
	status, code, o, err := c.call(ctx, http.MethodGet, path, nil)
	switch {
	case err != nil:
		return Order{}, err
	case status == http.StatusOK:
		return o, nil
	case status == http.StatusNotFound && code.Code == codeNotFound:
		return Order{}, ErrNotFound
	}
	return Order{}, fmt.Errorf("%w: lookup answered %d", ErrUnknown, status)
}

// venueError is the venue's error body.
type venueError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// call sends one request and reads the answer: the status with the error
// body or the order (a 200 whose order does not parse is ErrUnknown).
func (c *Client) call(ctx context.Context, method, path string, body io.Reader) (int, venueError, Order, error) {
	var ve venueError
	var o Order
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.URL, "/")+path, body)
	if err != nil {
		return 0, ve, o, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.KeyID != "" || c.SecretKey != "" {
		req.Header.Set("APCA-API-KEY-ID", c.KeyID)
		req.Header.Set("APCA-API-SECRET-KEY", c.SecretKey)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, ve, o, fmt.Errorf("%w: %s %s: %w", ErrUnknown, method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, ve, o, fmt.Errorf("%w: %s %s: reading the answer: %w", ErrUnknown, method, path, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &o); err != nil || o.ClientOrderID == "" {
			return 0, ve, o, fmt.Errorf("%w: %s %s: 200 without an order", ErrUnknown, method, path)
		}
		return resp.StatusCode, ve, o, nil
	}
	_ = json.Unmarshal(raw, &ve) // a body that is not the venue's leaves code 0
	return resp.StatusCode, ve, o, nil
}

// Trade places the order under clientOrderID and settles a duplicate id by
// looking the booked order up: the venue's order, a *RejectedError, or
// ErrUnknown.
func (c *Client) Trade(ctx context.Context, clientOrderID string, r Request) (Order, error) {
	o, err := c.Place(ctx, clientOrderID, r)
	if !errors.Is(err, ErrDuplicate) {
		return o, err
	}
	o, err = c.Lookup(ctx, clientOrderID)
	if errors.Is(err, ErrNotFound) {
		return Order{}, fmt.Errorf("%w: a duplicate client_order_id that the lookup does not find", ErrUnknown)
	}
	return o, err
}
