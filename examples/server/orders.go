package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
)

// maxBodyBytes bounds the bodies the example's handlers read. The
// idempotency middleware has read a keyed request's body already, under
// its own limit (413 idempotency_body_too_large).
const maxBodyBytes = 1 << 20

// maxQty bounds an order's quantity.
const maxQty = 1_000_000

// xfailSymbol makes the fake fill engine fail.
const xfailSymbol = "XFAIL"

var symbolRE = regexp.MustCompile(`^[A-Z][A-Z0-9.]{0,9}$`)

// orderRequest is the body of POST /api/trading/orders.
type orderRequest struct {
	Symbol string          `json:"symbol"`
	Side   string          `json:"side"`
	Qty    json.RawMessage `json:"qty"`
}

// validate returns the order it describes, or a message saying what is
// wrong with it.
func (in orderRequest) validate() (order, string) {
	if !symbolRE.MatchString(in.Symbol) {
		return order{}, `symbol must be 1 to 10 upper-case letters, digits or dots, starting with a letter, e.g. "AAPL"`
	}
	if in.Side != "buy" && in.Side != "sell" {
		return order{}, `side must be "buy" or "sell"`
	}
	qty, err := strconv.ParseInt(string(in.Qty), 10, 64) // a JSON integer literal only: no 1.0, 1e3 or "1"
	if err != nil || qty < 1 || qty > maxQty {
		return order{}, fmt.Sprintf("qty must be an integer from 1 to %d", maxQty)
	}
	return order{Symbol: in.Symbol, Side: in.Side, Qty: qty}, ""
}

// placeOrder is POST /api/trading/orders. Behind the session, the
// new-orders gate and the fail-closed idempotency middleware, it runs at
// most once per key: it validates, fills (simulated), and stores the order
// with its order_placed audit row.
func (s *server) placeOrder(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	o, ok := readOrder(w, r)
	if !ok {
		return
	}
	uid := o.UserID
	// Forward the key as the fill engine's client order id, as a live
	// broker integration would.
	o.ClientOrderID, _ = idempotency.KeyFromContext(ctx)

	if s.cfg.beforeFill != nil {
		s.cfg.beforeFill(ctx, o)
	}
	if d := s.cfg.orderLatency; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			// A keyed order's context ends at the lease minus the store
			// timeout, so that its outcome can still be recorded.
			t.Stop()
			s.log.Warn("order fill timed out", "user_id", uid, "symbol", o.Symbol, "cause", ctx.Err())
			writeError(w, http.StatusGatewayTimeout, "fill_timeout")
			return
		}
	}
	if o.Symbol == xfailSymbol {
		s.log.Warn("fill engine error (simulated)", "user_id", uid, "symbol", o.Symbol)
		writeError(w, http.StatusInternalServerError, "fill_engine_error")
		return
	}
	o.FillPrice = fillPrice(o.Symbol, o.Side)

	placed, err := s.data.placeOrder(ctx, o)
	if err != nil {
		s.dbError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/trading/orders/"+strconv.FormatInt(placed.ID, 10))
	writeJSON(w, http.StatusCreated, placed)
}

// readOrder reads and validates the order of POST /api/trading/orders, for
// the session's user, answering 400 itself when it is invalid.
func readOrder(w http.ResponseWriter, r *http.Request) (order, bool) {
	var in orderRequest
	if !readJSON(w, r, &in, "invalid_order", false) {
		return order{}, false
	}
	o, msg := in.validate()
	if msg != "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_order", "message": msg})
		return order{}, false
	}
	o.UserID, _ = userFromContext(r.Context())
	o.Status = "filled"
	return o, true
}

// fillPrice is the fake fill engine's price: a reference price derived from
// the symbol (the same every time), plus a cent's spread by side.
func fillPrice(symbol, side string) float64 {
	h := fnv.New32a()
	h.Write([]byte(symbol))
	ref := 10 + float64(h.Sum32()%49_000)/100 // 10.00 to 499.99
	if side == "buy" {
		ref += 0.01
	} else {
		ref -= 0.01
	}
	return math.Round(ref*100) / 100
}

// listOrders is GET /api/trading/orders.
func (s *server) listOrders(w http.ResponseWriter, r *http.Request) {
	uid, _ := userFromContext(r.Context())
	list, err := s.data.orders(r.Context(), uid)
	if err != nil {
		s.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"orders": list})
}

// getOrder is GET /api/trading/orders/{id}: 404 for anything that is not
// the user's order, so ids of other users' orders reveal nothing.
func (s *server) getOrder(w http.ResponseWriter, r *http.Request) {
	o, ok := s.findOrder(w, r)
	if ok {
		writeJSON(w, http.StatusOK, o)
	}
}

// cancelOrder is DELETE /api/trading/orders/{id}. Paper orders fill at once,
// so none can be cancelled: the answer is the same however often it is
// asked, which is why the route needs no idempotency key.
func (s *server) cancelOrder(w http.ResponseWriter, r *http.Request) {
	o, ok := s.findOrder(w, r)
	if ok {
		writeJSON(w, http.StatusConflict, map[string]string{"error": "order_not_cancellable", "status": o.Status})
	}
}

// findOrder looks up the {id} order of the session's user, answering 404 or
// 503 itself.
func (s *server) findOrder(w http.ResponseWriter, r *http.Request) (order, bool) {
	uid, _ := userFromContext(r.Context())
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusNotFound, "not_found")
		return order{}, false
	}
	o, err := s.data.order(r.Context(), uid, id)
	switch {
	case errors.Is(err, errNotFound):
		writeError(w, http.StatusNotFound, "not_found")
		return order{}, false
	case err != nil:
		s.dbError(w, r, err)
		return order{}, false
	}
	return o, true
}

// readJSON decodes the request body, one JSON object with known fields
// only, into dst. On failure it answers 400 {"error": errCode, "message":
// ...} (413 for an oversized body) and returns false. With optional, an
// empty body leaves dst as it is.
func readJSON(w http.ResponseWriter, r *http.Request, dst any, errCode string, optional bool) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large")
		return false
	case err != nil:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": errCode, "message": "the body could not be read"})
		return false
	case len(bytes.TrimSpace(body)) == 0 && optional:
		return true
	}
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": errCode, "message": "the body must be a JSON object"})
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(dst)
	if err == nil {
		if _, tokErr := dec.Token(); tokErr != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": errCode, "message": jsonErrorMessage(err)})
		return false
	}
	return true
}

// jsonErrorMessage says what is wrong with a body in client terms, without
// Go type names.
func jsonErrorMessage(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return fmt.Sprintf("field %q must not be a JSON %s", typeErr.Field, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("invalid JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "invalid JSON: the body ends too early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}
