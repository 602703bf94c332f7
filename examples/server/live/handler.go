package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
)

// Handler is the live order route's handler. Behind the idempotency
// middleware it runs at most once per key at a time: it reads the order,
// sends it to the venue under the derived client_order_id, and answers:
//   - the venue's order: Filled (the route's 201);
//   - a definite refusal (a 4xx other than a duplicate id): 422
//     {"error":"venue_rejected"};
//   - a duplicate id: the booked order, looked up, through Filled;
//   - anything else (timeout, dropped connection, 5xx):
//     idempotency.Unsettled, so the key is neither completed nor failed
//     and the retry finds out (Reconcile).
type Handler struct {
	// Venue is the venue's client.
	Venue *Client
	// Derive returns the request's client_order_id, the same for every
	// attempt of one key: DeriveOrderID. downstream.ErrNoKey (no
	// idempotency key: an optional key, or the kill-switch) sends a random
	// id instead, with no deduplication, as for the request itself; any
	// other error (downstream.ErrKeyRetired) answers 500
	// {"error":"venue_key_unavailable"} and calls nothing.
	Derive func(ctx context.Context) (string, error)
	// Read reads and validates the request's order; when it returns false
	// it has answered.
	Read func(w http.ResponseWriter, r *http.Request) (Request, bool)
	// Filled answers the venue's order: what the route answers on success.
	Filled func(w http.ResponseWriter, r *http.Request, in Request, o Order)
	// Latency is waited before the venue call (simulated). A request whose
	// context ends first answers 504 {"error":"fill_timeout"}: nothing
	// was sent.
	Latency time.Duration
	// Log gets one line per order that does not fill. Defaults to
	// slog.Default().
	Log *slog.Logger
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := h.Log
	if log == nil {
		log = slog.Default()
	}
	in, ok := h.Read(w, r)
	if !ok {
		return
	}
	id, err := h.Derive(ctx)
	switch {
	case errors.Is(err, downstream.ErrNoKey):
		id = randomID()
	case err != nil:
		log.Error("venue: no client_order_id for the order", "error", err)
		writeError(w, http.StatusInternalServerError, "venue_key_unavailable")
		return
	}
	if !wait(ctx, h.Latency) {
		log.Warn("venue: order timed out before it was sent", "symbol", in.Symbol, "cause", ctx.Err())
		writeError(w, http.StatusGatewayTimeout, "fill_timeout")
		return
	}
	o, err := h.Venue.Trade(ctx, id, in)
	var rejected *RejectedError
	switch {
	case err == nil:
		h.Filled(w, r, in, o)
	case errors.As(err, &rejected):
		log.Warn("venue: order rejected", "symbol", in.Symbol, "status", rejected.Status, "code", rejected.Code, "message", rejected.Message)
		writeError(w, http.StatusUnprocessableEntity, "venue_rejected")
	default:
		log.Warn("venue: outcome unknown; the retry settles it", "symbol", in.Symbol, "error", err)
		idempotency.Unsettled(w, r)
	}
}

// wait waits d, false when ctx ends first.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// randomID is a client_order_id for an order without an idempotency key.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// DeriveOrderID is the order's client_order_id: the key derived for the
// downstream "venue", leg "entry", in the Alpaca profile, the same for
// every attempt of one key (downstream.Key; Config.DeriveKeys keys it).
func DeriveOrderID(ctx context.Context) (string, error) {
	return downstream.Key(ctx, "venue", "entry", downstream.Alpaca)
}

func writeError(w http.ResponseWriter, status int, code string) {
	body, _ := json.Marshal(map[string]string{"error": code})
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Reconcile returns the order route's reconcile hook (RouteConfig.Reconcile):
// it looks up the order a stale key sent, by the client_order_id derived
// for the key's row (DeriveOrderID: the hook's context carries the row).
// Found: done, with answer's response for it, which the route records and
// replays. Not found (404 code 40410000): idempotency.ErrNotDone, and the
// handler runs again under the same id. Anything else: unknown (409
// idempotency_outcome_unknown; a later retry asks again).
func Reconcile(c *Client, answer func(ctx context.Context, info idempotency.ReconcileInfo, o Order) (idempotency.Response, error)) func(context.Context, idempotency.ReconcileInfo) (any, error) {
	return func(ctx context.Context, info idempotency.ReconcileInfo) (any, error) {
		id, err := DeriveOrderID(ctx)
		if err != nil {
			return nil, err
		}
		o, err := c.Lookup(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil, idempotency.ErrNotDone
		case err != nil:
			return nil, err
		}
		return answer(ctx, info, o)
	}
}
