package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The venue's error codes (settled item 32).
const (
	codeInvalid     = 40010000
	codeDuplicate   = 40010001
	codeNotFound    = 40410000
	codeUnavailable = 50300000
)

// maxClientOrderID is the longest client_order_id the venue takes, in
// characters.
const maxClientOrderID = 128

var (
	symbolRE = regexp.MustCompile(`^[A-Z][A-Z0-9.]{0,9}$`)
	qtyRE    = regexp.MustCompile(`^[1-9][0-9]{0,8}$`)
)

// orderRequest is the body of POST /v2/orders.
type orderRequest struct {
	Symbol        string `json:"symbol"`
	Qty           string `json:"qty"`
	Side          string `json:"side"`
	Type          string `json:"type"`
	TimeInForce   string `json:"time_in_force"`
	ClientOrderID string `json:"client_order_id"`
}

// problem says what is wrong with an order, "" when nothing is.
func (in orderRequest) problem() string {
	switch {
	case !symbolRE.MatchString(in.Symbol):
		return "symbol must be 1 to 10 upper-case letters, digits or dots, starting with a letter"
	case !qtyRE.MatchString(in.Qty):
		return "qty must be a positive whole number as a string"
	case in.Side != "buy" && in.Side != "sell":
		return `side must be "buy" or "sell"`
	case in.Type != "market":
		return `type must be "market"`
	case in.TimeInForce != "day":
		return `time_in_force must be "day"`
	case in.ClientOrderID == "" || utf8.RuneCountInString(in.ClientOrderID) > maxClientOrderID:
		return fmt.Sprintf("client_order_id must be 1 to %d characters", maxClientOrderID)
	}
	return ""
}

// venue is the paper broker's HTTP handler.
type venue struct {
	book     *book
	faults   faultBox
	log      *slog.Logger
	received atomic.Int64 // orders read, whatever became of them
	mux      *http.ServeMux
	exit     func(code int) // os.Exit; tests replace it
}

func newVenue(b *book, f faults, log *slog.Logger) *venue {
	v := &venue{book: b, log: log, mux: http.NewServeMux(), exit: os.Exit}
	v.faults.set(f)
	v.mux.HandleFunc("POST /v2/orders", v.placeOrder)
	v.mux.HandleFunc("GET /v2/orders:by_client_order_id", v.orderByClientID)
	v.mux.HandleFunc("GET /control/faults", v.getFaults)
	v.mux.HandleFunc("POST /control/faults", v.setFaults)
	v.mux.HandleFunc("GET /control/orders", v.listOrders)
	return v
}

func (v *venue) ServeHTTP(w http.ResponseWriter, r *http.Request) { v.mux.ServeHTTP(w, r) }

// placeOrder is POST /v2/orders, with the faults in force.
func (v *venue) placeOrder(w http.ResponseWriter, r *http.Request) {
	var in orderRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<16))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		writeCode(w, http.StatusUnprocessableEntity, codeInvalid, "the body must be a JSON order")
		return
	}
	if msg := in.problem(); msg != "" {
		writeCode(w, http.StatusUnprocessableEntity, codeInvalid, msg)
		return
	}
	v.received.Add(1)
	if hold, release := v.faults.hold(); hold > 0 {
		// The order is read in full: like a real venue, it goes on whether
		// or not the client is still there, after the hold or once the
		// faults are set again.
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-release:
			t.Stop()
		}
	}
	switch f, _ := v.faults.take(fault5xx, faultCrashBefore); f {
	case fault5xx:
		v.log.Warn("fault: 503 before booking", "client_order_id", in.ClientOrderID)
		writeCode(w, http.StatusServiceUnavailable, codeUnavailable, "service unavailable (fault 5xx)")
		return
	case faultCrashBefore:
		v.log.Warn("fault: crash before booking", "client_order_id", in.ClientOrderID)
		v.exit(crashStatus)
		return
	}

	o := fill(in, time.Now().UTC())
	err = v.book.add(o)
	switch {
	case errors.Is(err, errDuplicate):
		writeCode(w, http.StatusUnprocessableEntity, codeDuplicate, errDuplicate.Error())
		return
	case err != nil:
		v.log.Error("order book write failed", "error", err)
		writeCode(w, http.StatusInternalServerError, 50000000, "internal error")
		return
	}
	v.log.Info("order booked", "id", o.ID, "client_order_id", o.ClientOrderID, "symbol", o.Symbol, "qty", o.Qty)
	switch f, delay := v.faults.take(faultDrop, faultDelay, faultCrashAfter); f {
	case faultDrop:
		v.log.Warn("fault: booked, response dropped", "client_order_id", o.ClientOrderID)
		panic(http.ErrAbortHandler) // closes the connection, nothing written
	case faultDelay:
		v.log.Warn("fault: booked, answer delayed", "client_order_id", o.ClientOrderID, "delay", delay.String())
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client gave up: nobody to answer
			t.Stop()
			return
		}
	case faultCrashAfter:
		v.log.Warn("fault: booked, crash before answering", "client_order_id", o.ClientOrderID)
		v.exit(crashStatus)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// fill is the venue's fill of an accepted order: whole, at once, at the
// symbol's price.
func fill(in orderRequest, now time.Time) order {
	at := now.Format(time.RFC3339Nano)
	return order{
		ID: newUUID(), ClientOrderID: in.ClientOrderID, Symbol: in.Symbol, Qty: in.Qty, Side: in.Side,
		Status: "filled", FilledQty: in.Qty, FilledAvgPrice: price(in.Symbol), CreatedAt: at, FilledAt: at,
	}
}

// price is a symbol's fixed fill price, from 10.00 to 499.99.
func price(symbol string) string {
	h := fnv.New32a()
	h.Write([]byte(symbol))
	cents := 1000 + h.Sum32()%49_000
	return fmt.Sprintf("%d.%02d", cents/100, cents%100)
}

// orderByClientID is GET /v2/orders:by_client_order_id.
func (v *venue) orderByClientID(w http.ResponseWriter, r *http.Request) {
	o, ok := v.book.find(r.URL.Query().Get("client_order_id"))
	if !ok {
		writeCode(w, http.StatusNotFound, codeNotFound, "order not found")
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// getFaults is GET /control/faults: the faults in force and the counters.
func (v *venue) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"faults": v.faults.get().setting(), "received": v.received.Load(), "orders": v.book.len(),
	})
}

// setFaults is POST /control/faults: it replaces the faults in force.
func (v *venue) setFaults(w http.ResponseWriter, r *http.Request) {
	var s faultSetting
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<12)).Decode(&s); err != nil {
		writeCode(w, http.StatusBadRequest, codeInvalid, "the body must be a JSON fault setting")
		return
	}
	f, err := parseFaults(s)
	if err != nil {
		writeCode(w, http.StatusBadRequest, codeInvalid, err.Error())
		return
	}
	v.faults.set(f)
	v.log.Info("faults set", "fault", f.setting())
	writeJSON(w, http.StatusOK, map[string]any{"faults": f.setting()})
}

// listOrders is GET /control/orders: the whole book.
func (v *venue) listOrders(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"orders": v.book.all()})
}

// writeCode sends the venue's error body.
func writeCode(w http.ResponseWriter, status, code int, msg string) {
	writeJSON(w, status, map[string]any{"code": code, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
