package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// newTestVenue serves a venue on a fresh book in t's temp dir, in-process.
func newTestVenue(t *testing.T, f faults) (*venue, *httptest.Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "book.jsonl")
	b, err := openBook(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	v := newVenue(b, f, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(v)
	t.Cleanup(srv.Close)
	return v, srv, path
}

// venueOrder is a valid order body for a client_order_id.
func venueOrder(cid string) map[string]string {
	return map[string]string{"symbol": "AAPL", "qty": "3", "side": "buy", "type": "market", "time_in_force": "day", "client_order_id": cid}
}

// call sends a JSON body (nil: none) and returns the status and the body
// decoded, or an error for a connection the venue dropped.
func call(t *testing.T, method, url string, body any) (int, map[string]any, error) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: body %q is not JSON", method, url, raw)
		}
	}
	return resp.StatusCode, out, nil
}

func mustCall(t *testing.T, method, url string, body any) (int, map[string]any) {
	t.Helper()
	status, out, err := call(t, method, url, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return status, out
}

// TestVenueWireFormat: the subset of settled item 32, field by field.
func TestVenueWireFormat(t *testing.T) {
	t.Parallel()
	_, srv, _ := newTestVenue(t, faults{})
	status, o := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("cid-1"))
	if status != 200 {
		t.Fatalf("POST /v2/orders: %d %v", status, o)
	}
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	priceRE := regexp.MustCompile(`^[0-9]+\.[0-9]{2}$`)
	if !uuidRE.MatchString(o["id"].(string)) || o["client_order_id"] != "cid-1" || o["symbol"] != "AAPL" ||
		o["qty"] != "3" || o["side"] != "buy" || o["status"] != "filled" || o["filled_qty"] != "3" ||
		!priceRE.MatchString(o["filled_avg_price"].(string)) {
		t.Fatalf("order %v", o)
	}
	for _, f := range []string{"created_at", "filled_at"} {
		if _, err := time.Parse(time.RFC3339, o[f].(string)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}

	// The same symbol fills at the same price; a second order with the id
	// is refused and books nothing.
	other := venueOrder("cid-2")
	other["side"] = "sell"
	if _, o2 := mustCall(t, "POST", srv.URL+"/v2/orders", other); o2["filled_avg_price"] != o["filled_avg_price"] {
		t.Fatalf("price %v, then %v for the same symbol", o["filled_avg_price"], o2["filled_avg_price"])
	}
	status, dup := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("cid-1"))
	if status != 422 || dup["code"] != float64(40010001) || dup["message"] != "client_order_id must be unique" {
		t.Fatalf("duplicate: %d %v", status, dup)
	}
	status, found := mustCall(t, "GET", srv.URL+"/v2/orders:by_client_order_id?client_order_id=cid-1", nil)
	if status != 200 || found["id"] != o["id"] {
		t.Fatalf("lookup: %d %v, want the order %v", status, found, o["id"])
	}
	status, nf := mustCall(t, "GET", srv.URL+"/v2/orders:by_client_order_id?client_order_id=nope", nil)
	if status != 404 || nf["code"] != float64(40410000) || nf["message"] != "order not found" {
		t.Fatalf("lookup of an unknown id: %d %v", status, nf)
	}
	_, list := mustCall(t, "GET", srv.URL+"/control/orders", nil)
	if n := len(list["orders"].([]any)); n != 2 {
		t.Fatalf("%d orders booked, want 2", n)
	}

	for name, mutate := range map[string]func(map[string]string){
		"qty zero":      func(m map[string]string) { m["qty"] = "0" },
		"qty number":    func(m map[string]string) { m["qty"] = "1.5" },
		"side":          func(m map[string]string) { m["side"] = "short" },
		"type":          func(m map[string]string) { m["type"] = "limit" },
		"time in force": func(m map[string]string) { m["time_in_force"] = "gtc" },
		"no id":         func(m map[string]string) { m["client_order_id"] = "" },
		"long id":       func(m map[string]string) { m["client_order_id"] = strings.Repeat("x", 129) },
	} {
		body := venueOrder("bad-" + name)
		mutate(body)
		status, out := mustCall(t, "POST", srv.URL+"/v2/orders", body)
		if status != 422 || out["code"] != float64(40010000) {
			t.Errorf("%s: %d %v, want 422 code 40010000", name, status, out)
		}
	}
	if status, _ := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder(strings.Repeat("é", 128))); status != 200 {
		t.Errorf("a client_order_id of 128 characters: %d, want 200", status)
	}
}

// TestVenueBookDurable: the book survives a restart, drops the torn last
// line of a crash, and refuses to start on a damaged line before the last.
func TestVenueBookDurable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "book.jsonl")
	b, err := openBook(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"a", "b"} {
		if err := b.add(fill(orderRequest{Symbol: "X", Qty: "1", Side: "buy", ClientOrderID: cid}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	b.close()
	// A crash while the third line was written leaves half of it.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(`{"id":"x","client_order_id":"c","sym`)
	f.Close()

	b, err = openBook(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.find("a"); !ok || b.len() != 2 {
		t.Fatalf("reloaded %d orders, want a and b", b.len())
	}
	if err := b.add(fill(orderRequest{Symbol: "X", Qty: "1", Side: "buy", ClientOrderID: "c"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	if err := b.add(fill(orderRequest{Symbol: "X", Qty: "1", Side: "buy", ClientOrderID: "a"}, time.Now())); err != errDuplicate {
		t.Fatalf("a again: %v, want errDuplicate", err)
	}
	b.close()
	if b, err = openBook(path); err != nil || b.len() != 3 {
		t.Fatalf("reopened: %v, %d orders, want 3", err, b.len())
	}
	b.close()

	raw, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(raw), "\n")
	damaged := lines[0] + "not an order\n" + lines[2]
	if err := os.WriteFile(path, []byte(damaged), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openBook(path); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a damaged second line: %v, want an error naming line 2", err)
	}
}

// TestVenueFaults: each fault does what the package comment says, for as
// many orders as its count.
func TestVenueFaults(t *testing.T) {
	t.Parallel()
	booked := func(v *venue, cid string) bool { _, ok := v.book.find(cid); return ok }

	t.Run("drop", func(t *testing.T) {
		t.Parallel()
		v, srv, _ := newTestVenue(t, faults{fault: faultDrop, count: 1})
		if _, _, err := call(t, "POST", srv.URL+"/v2/orders", venueOrder("d1")); err == nil {
			t.Fatal("the dropped order got an answer")
		}
		if !booked(v, "d1") {
			t.Fatal("the dropped order is not booked")
		}
		// The count is spent: the duplicate is refused as usual.
		if status, out := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("d1")); status != 422 || out["code"] != float64(40010001) {
			t.Fatalf("retry: %d %v", status, out)
		}
	})
	t.Run("5xx", func(t *testing.T) {
		t.Parallel()
		v, srv, _ := newTestVenue(t, faults{fault: fault5xx, count: 2})
		for range 2 {
			if status, _ := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("f1")); status != 503 {
				t.Fatalf("status %d, want 503", status)
			}
		}
		if booked(v, "f1") {
			t.Fatal("a 503 booked the order")
		}
		if status, _ := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("f1")); status != 200 {
			t.Fatalf("after the count: %d, want 200", status)
		}
	})
	t.Run("delay", func(t *testing.T) {
		t.Parallel()
		v, srv, _ := newTestVenue(t, faults{fault: faultDelay, count: 1, delay: time.Hour})
		hc := &http.Client{Timeout: 200 * time.Millisecond}
		b, _ := json.Marshal(venueOrder("l1"))
		if resp, err := hc.Post(srv.URL+"/v2/orders", "application/json", bytes.NewReader(b)); err == nil {
			resp.Body.Close()
			t.Fatal("the delayed order answered at once")
		}
		if !booked(v, "l1") {
			t.Fatal("the delayed order is not booked")
		}
	})
	for _, tc := range []struct {
		fault  string
		booked bool
	}{{faultCrashBefore, false}, {faultCrashAfter, true}} {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			v, srv, _ := newTestVenue(t, faults{fault: tc.fault, count: 1})
			exited := make(chan int, 1)
			v.exit = func(code int) { exited <- code; panic(http.ErrAbortHandler) }
			if _, _, err := call(t, "POST", srv.URL+"/v2/orders", venueOrder("c1")); err == nil {
				t.Fatal("the crashed order got an answer")
			}
			if code := <-exited; code != crashStatus {
				t.Fatalf("exit %d, want %d", code, crashStatus)
			}
			if booked(v, "c1") != tc.booked {
				t.Fatalf("booked %v, want %v", !tc.booked, tc.booked)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		_, srv, _ := newTestVenue(t, faults{})
		if status, _ := mustCall(t, "POST", srv.URL+"/control/faults", map[string]any{"fault": "flood"}); status != 400 {
			t.Fatalf("an unknown fault: %d, want 400", status)
		}
		status, out := mustCall(t, "POST", srv.URL+"/control/faults", map[string]any{"fault": "5xx", "count": 1})
		if status != 200 {
			t.Fatalf("set: %d %v", status, out)
		}
		if status, _ := mustCall(t, "POST", srv.URL+"/v2/orders", venueOrder("k1")); status != 503 {
			t.Fatalf("status %d, want the 503 set by the control endpoint", status)
		}
		_, got := mustCall(t, "GET", srv.URL+"/control/faults", nil)
		if got["faults"].(map[string]any)["fault"] != "" || got["received"] != float64(1) || got["orders"] != float64(0) {
			t.Fatalf("after the count: %v", got)
		}
	})
}
