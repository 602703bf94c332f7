package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeVenue is a venue of settled item 32's shape for in-process tests:
// it books each new client_order_id once (duplicates: 422 code 40010001)
// and answers as mode says: "" books, "reject" refuses with 403, "down"
// answers 503 before booking.
type fakeVenue struct {
	mu     sync.Mutex
	mode   string
	orders map[string]map[string]string
	posts  int
}

func newFakeVenue(t *testing.T) (*fakeVenue, string) {
	t.Helper()
	v := &fakeVenue{orders: map[string]map[string]string{}}
	srv := httptest.NewServer(v)
	t.Cleanup(srv.Close)
	return v, srv.URL
}

func (v *fakeVenue) set(mode string) { v.mu.Lock(); v.mode = mode; v.mu.Unlock() }

func (v *fakeVenue) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	answer := func(status int, body any) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}
	if r.Method == "GET" {
		if o, ok := v.orders[r.URL.Query().Get("client_order_id")]; ok {
			answer(200, o)
			return
		}
		answer(404, map[string]any{"code": 40410000, "message": "order not found"})
		return
	}
	v.posts++
	var in map[string]string
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &in)
	switch {
	case v.mode == "reject":
		answer(403, map[string]any{"code": 40310000, "message": "insufficient buying power"})
	case v.mode == "down":
		answer(503, map[string]any{"code": 50300000, "message": "down"})
	case v.orders[in["client_order_id"]] != nil:
		answer(422, map[string]any{"code": 40010001, "message": "client_order_id must be unique"})
	default:
		o := map[string]string{"id": "b6f0a3c2-0000-4000-8000-000000000001", "client_order_id": in["client_order_id"], "symbol": in["symbol"],
			"qty": in["qty"], "side": in["side"], "status": "filled", "filled_qty": in["qty"], "filled_avg_price": "123.40",
			"created_at": "2026-12-06T10:00:00Z", "filled_at": "2026-12-06T10:00:00Z"}
		v.orders[in["client_order_id"]] = o
		answer(200, o)
	}
}

// TestLiveModeAnswersAsPaper: in live mode the order route answers as the
// paper mode does (201, the order with an integer id, status "filled",
// Location, one order_placed audit row, a replay for the retry), with the
// venue's price and client_order_id; a venue's refusal is 422
// venue_rejected; an unknown outcome records nothing and the retry, under
// the same client_order_id, finds the order booked.
func TestLiveModeAnswersAsPaper(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]backend{"Memory": memoryBackend, "Postgres": postgresBackend} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			venue, url := newFakeVenue(t)
			e := b(t, envOptions{venueURL: url})
			uid, tok := e.newUser(t)
			body := map[string]any{"symbol": "AAPL", "side": "buy", "qty": 3}

			r := e.order(t, tok, "11111111-1111-4111-8111-111111111111", body)
			expect(t, r, http.StatusCreated, "")
			cid, _ := r.Body["client_order_id"].(string)
			if _, ok := r.Body["id"].(float64); !ok || r.Body["status"] != "filled" || r.Body["fill_price"] != 123.4 ||
				venue.orders[cid] == nil || r.Header.Get("Location") == "" {
				t.Fatalf("live order %s, want the paper answer with the venue's price and client_order_id", r)
			}
			again := e.order(t, tok, "11111111-1111-4111-8111-111111111111", body)
			if again.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || venue.posts != 1 {
				t.Fatalf("retry: %s, %d posts to the venue", again, venue.posts)
			}

			venue.set("reject")
			expect(t, e.order(t, tok, "22222222-2222-4222-8222-222222222222", body), http.StatusUnprocessableEntity, "venue_rejected")

			venue.set("down")
			key := "33333333-3333-4333-8333-333333333333"
			first := e.order(t, tok, key, body)
			if first.Status < 429 {
				t.Fatalf("an unknown venue outcome answered %s", first)
			}
			venue.set("")
			r = e.order(t, tok, key, body)
			expect(t, r, http.StatusCreated, "")
			if got := e.auditCounts(t, uid)["order_placed"]; got != 2 {
				t.Fatalf("%d order_placed rows, want 2 (one per venue order)", got)
			}
			if n := len(e.orders(t, tok)); n != 2 || len(venue.orders) != 2 {
				t.Fatalf("%d local orders, %d venue orders, want 2 and 2", n, len(venue.orders))
			}
		})
	}
}
