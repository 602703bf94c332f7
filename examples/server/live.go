package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/downstream"
	"github.com/idemkit/idempotency/examples/server/live"
)

// ordersEndpoint is the order route's endpoint name: its ServeMux pattern.
const ordersEndpoint = "POST /api/trading/orders"

// orderHandler is the order route's handler: the paper fill, or in live mode
// (-venue-url) the venue's (docs/live-trading.md).
func (s *server) orderHandler() http.Handler {
	if s.cfg.venueURL == "" {
		return http.HandlerFunc(s.placeOrder)
	}
	return &live.Handler{
		Venue:   s.venueClient(),
		Derive:  live.DeriveOrderID,
		Read:    s.readLiveOrder,
		Filled:  s.liveFilled,
		Latency: s.cfg.orderLatency,
		Log:     s.log,
	}
}

// venueClient is the live mode's client of the venue.
func (s *server) venueClient() *live.Client {
	return &live.Client{URL: s.cfg.venueURL, KeyID: s.cfg.venueKeyID, SecretKey: s.cfg.venueSecret}
}

// orderReconcile is the order route's reconcile hook in live mode (nil in
// paper mode): a key left in flight (a crash) is settled by looking its
// order up at the venue; a found order is stored locally, once, and
// answered as the handler would have.
func (s *server) orderReconcile() func(context.Context, idempotency.ReconcileInfo) (any, error) {
	if s.cfg.venueURL == "" {
		return nil
	}
	return live.Reconcile(s.venueClient(), func(ctx context.Context, info idempotency.ReconcileInfo, vo live.Order) (idempotency.Response, error) {
		uid, err := strconv.ParseInt(info.Scope, 10, 64)
		if err != nil {
			return idempotency.Response{}, fmt.Errorf("reconcile: scope %q is not a user id", info.Scope)
		}
		qty, err := strconv.ParseInt(vo.Qty, 10, 64)
		if err != nil {
			return idempotency.Response{}, fmt.Errorf("reconcile: the venue's qty %q: %w", vo.Qty, err)
		}
		placed, err := s.recordFill(ctx, uid, live.Request{Symbol: vo.Symbol, Side: vo.Side, Qty: qty}, vo)
		if err != nil {
			return idempotency.Response{}, err
		}
		body, err := json.Marshal(placed)
		if err != nil {
			return idempotency.Response{}, err
		}
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/api/trading/orders/"+strconv.FormatInt(placed.ID, 10))
		return idempotency.Response{Status: http.StatusCreated, Header: h, Body: append(body, '\n')}, nil
	})
}

// deriveKeys is Config.DeriveKeys: in live mode IDEMPOTENCY_DERIVE_KEYS, or
// a key generated now, with a warning; nil in paper mode.
func deriveKeys(cfg config) (idempotency.DeriveKeys, error) {
	switch {
	case cfg.venueURL == "":
		return nil, nil
	case cfg.deriveKeys != nil:
		return cfg.deriveKeys, nil
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	keys, err := downstream.ParseKeys("generated:" + base64.StdEncoding.EncodeToString(b[:]))
	if err != nil {
		return nil, err
	}
	cfg.logger.Warn(envDeriveKeys + " is unset: client_order_ids are derived under a key generated now, so after a restart a retry sends a new id and the venue may book it twice; set it outside development")
	return keys, nil
}

// readLiveOrder is readOrder for the live handler.
func (s *server) readLiveOrder(w http.ResponseWriter, r *http.Request) (live.Request, bool) {
	o, ok := readOrder(w, r)
	return live.Request{Symbol: o.Symbol, Side: o.Side, Qty: o.Qty}, ok
}

// liveFilled answers a venue's fill as the paper mode answers its own:
// the order, stored with its order_placed audit row (in the route's
// transaction on PostgreSQL), 201 with its Location. fill_price is the
// venue's filled_avg_price, client_order_id the venue's.
func (s *server) liveFilled(w http.ResponseWriter, r *http.Request, in live.Request, vo live.Order) {
	uid, _ := userFromContext(r.Context())
	placed, err := s.recordFill(r.Context(), uid, in, vo)
	if err != nil {
		// The venue holds the order: a failure here must not fail the key.
		s.log.Error("venue: could not store the venue's fill; the retry settles it", "error", err)
		idempotency.Unsettled(w, r)
		return
	}
	w.Header().Set("Location", "/api/trading/orders/"+strconv.FormatInt(placed.ID, 10))
	writeJSON(w, http.StatusCreated, placed)
}

// recordFill stores the venue's order as the user's paper order, unless an
// earlier attempt committed it already (the same client_order_id): one
// local order and one order_placed row per venue order.
func (s *server) recordFill(ctx context.Context, uid int64, in live.Request, vo live.Order) (order, error) {
	price, err := vo.FillPrice()
	if err != nil {
		return order{}, err
	}
	if o, err := s.data.orderByClientID(ctx, uid, vo.ClientOrderID); !errors.Is(err, errNotFound) {
		return o, err
	}
	return s.data.placeOrder(ctx, order{UserID: uid, Symbol: in.Symbol, Side: in.Side, Qty: in.Qty, Status: "filled",
		FillPrice: price, ClientOrderID: vo.ClientOrderID})
}
