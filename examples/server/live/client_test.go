package live

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/downstream"
)

const testOrder = `{"id":"0dbcaeae-660b-40cd-abd3-2b8aa1ee13b6","client_order_id":"cid","symbol":"AAPL","qty":"3","side":"buy","status":"filled","filled_qty":"3","filled_avg_price":"479.55","created_at":"2026-12-06T09:29:47Z","filled_at":"2026-12-06T09:29:47Z"}`

// stub is a venue that answers every request with status and body, or
// drops the connection when status is 0.
func stub(t *testing.T, status int, body string) (*Client, *http.Request) {
	t.Helper()
	var mu sync.Mutex
	seen := &http.Request{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*seen = *r.Clone(context.Background())
		mu.Unlock()
		if status == 0 {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return &Client{URL: srv.URL}, seen
}

// TestVenueClientClassifies: every answer of the wire format (settled item
// 32) lands in its class, and every other answer is unknown.
func TestVenueClientClassifies(t *testing.T) {
	t.Parallel()
	req := Request{Symbol: "AAPL", Side: "buy", Qty: 3}
	for _, tc := range []struct {
		name   string
		status int
		body   string
		place  func(error) bool
		lookup func(error) bool
	}{
		{"order", 200, testOrder, isNil, isNil},
		{"200 without an order", 200, `{"message":"ok"}`, isUnknown, isUnknown},
		{"duplicate", 422, `{"code":40010001,"message":"client_order_id must be unique"}`, is(ErrDuplicate), isUnknown},
		{"invalid", 422, `{"code":40010000,"message":"qty"}`, isRejected, isUnknown},
		{"forbidden", 403, `{"code":40310000,"message":"insufficient buying power"}`, isRejected, isUnknown},
		{"not found", 404, `{"code":40410000,"message":"order not found"}`, isRejected, is(ErrNotFound)},
		{"404 of something else", 404, `not found`, isRejected, isUnknown},
		{"500", 500, `{"code":50000000}`, isUnknown, isUnknown},
		{"503", 503, ``, isUnknown, isUnknown},
		{"dropped", 0, ``, isUnknown, isUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := stub(t, tc.status, tc.body)
			o, err := c.Place(context.Background(), "cid", req)
			if !tc.place(err) {
				t.Errorf("Place: %v", err)
			}
			if err == nil && (o.ClientOrderID != "cid" || o.FilledAvgPrice != "479.55") {
				t.Errorf("Place: order %+v", o)
			}
			if _, err := c.Lookup(context.Background(), "cid"); !tc.lookup(err) {
				t.Errorf("Lookup: %v", err)
			}
		})
	}
}

func isNil(err error) bool             { return err == nil }
func isUnknown(err error) bool         { return errors.Is(err, ErrUnknown) }
func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }
func isRejected(err error) bool {
	var r *RejectedError
	return errors.As(err, &r) && !errors.Is(err, ErrUnknown)
}

// TestVenueClientSends: the order's body and the credentials' headers, only
// when set.
func TestVenueClientSends(t *testing.T) {
	t.Parallel()
	c, seen := stub(t, 200, testOrder)
	if _, err := c.Place(context.Background(), "cid", Request{Symbol: "AAPL", Side: "buy", Qty: 3}); err != nil {
		t.Fatal(err)
	}
	if seen.Header.Get("APCA-API-KEY-ID") != "" || seen.Header.Values("APCA-API-SECRET-KEY") != nil {
		t.Fatalf("credentials sent without being set: %v", seen.Header)
	}
	c.KeyID, c.SecretKey = "kid", "secret"
	if _, err := c.Lookup(context.Background(), "a b&c"); err != nil {
		t.Fatal(err)
	}
	if seen.Header.Get("APCA-API-KEY-ID") != "kid" || seen.Header.Get("APCA-API-SECRET-KEY") != "secret" {
		t.Fatalf("headers %v", seen.Header)
	}
	if seen.URL.Path != "/v2/orders:by_client_order_id" || seen.URL.Query().Get("client_order_id") != "a b&c" {
		t.Fatalf("lookup URL %v", seen.URL)
	}
}

// TestVenueClientDeadline: a venue that does not answer is unknown when
// the context ends.
func TestVenueClientDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := (&Client{URL: srv.URL}).Place(ctx, "cid", Request{Symbol: "A", Side: "buy", Qty: 1})
	if !errors.Is(err, ErrUnknown) {
		t.Fatalf("err %v, want ErrUnknown", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

// TestVenueHandlerAnswers: the live handler's answer to each class.
func TestVenueHandlerAnswers(t *testing.T) {
	t.Parallel()
	dup := `{"code":40010001,"message":"client_order_id must be unique"}`
	for _, tc := range []struct {
		name       string
		place      func(w http.ResponseWriter)
		derive     func(context.Context) (string, error)
		wantStatus int
		wantBody   string
	}{
		{"filled", func(w http.ResponseWriter) { _, _ = io.WriteString(w, testOrder) }, fixedID, 201, `"cid"`},
		{"rejected", func(w http.ResponseWriter) { w.WriteHeader(403); _, _ = io.WriteString(w, `{"code":40310000}`) }, fixedID, 422, `{"error":"venue_rejected"}`},
		{"duplicate", func(w http.ResponseWriter) { w.WriteHeader(422); _, _ = io.WriteString(w, dup) }, fixedID, 201, `"cid"`},
		{"unknown", func(w http.ResponseWriter) { w.WriteHeader(502) }, fixedID, 503, `{"error":"idempotency_store_unavailable"}`},
		{"no key", func(w http.ResponseWriter) { _, _ = io.WriteString(w, testOrder) }, noKey, 201, `"cid"`},
		{"derive fails", nil, func(context.Context) (string, error) { return "", errors.New("key retired") }, 500, `{"error":"venue_key_unavailable"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sent []string
			var mu sync.Mutex
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == "GET" {
					_, _ = io.WriteString(w, testOrder)
					return
				}
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				sent = append(sent, string(b))
				mu.Unlock()
				tc.place(w)
			}))
			defer srv.Close()
			h := &Handler{
				Venue:  &Client{URL: srv.URL},
				Derive: tc.derive,
				Read: func(http.ResponseWriter, *http.Request) (Request, bool) {
					return Request{Symbol: "AAPL", Side: "buy", Qty: 3}, true
				},
				Filled: func(w http.ResponseWriter, _ *http.Request, _ Request, o Order) {
					w.WriteHeader(201)
					_, _ = io.WriteString(w, `"`+o.ClientOrderID+`"`)
				},
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("POST", "/", nil))
			if rec.Code != tc.wantStatus || strings.TrimSpace(rec.Body.String()) != tc.wantBody {
				t.Fatalf("answer %d %q, want %d %q", rec.Code, rec.Body, tc.wantStatus, tc.wantBody)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.place == nil && len(sent) != 0:
				t.Fatalf("the venue was called without a client_order_id: %v", sent)
			case tc.name == "no key" && (len(sent) != 1 || strings.Contains(sent[0], `"client_order_id":"fixed"`) || !strings.Contains(sent[0], `"client_order_id":"`)):
				t.Fatalf("no key: sent %v, want a random client_order_id", sent)
			case tc.place != nil && tc.name != "no key" && (len(sent) != 1 || !strings.Contains(sent[0], `"client_order_id":"fixed"`)):
				t.Fatalf("sent %v, want one order under the derived id", sent)
			}
		})
	}
}

func fixedID(context.Context) (string, error) { return "fixed", nil }
func noKey(context.Context) (string, error)   { return "", downstream.ErrNoKey }
