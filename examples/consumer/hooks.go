package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Test hooks, off unless their environment variables are set. The tests
// run the consumer as a process of its own and need it to stop at exact
// points (to kill -9 it there, or to let an ack wait expire) and to lose
// acks on purpose, without sleeps:
//
//	EXAMPLE_CONSUMER_HOLD=ledger  the first delivery to write its ledger entry stops inside the
//	                              transaction, its row written and not committed
//	EXAMPLE_CONSUMER_HOLD=ack     the first delivery to be acked stops before the ack
//
// A held delivery logs "hold" (with its delivery count) and waits for a line on standard input (or its
// function's deadline).
//
//	EXAMPLE_CONSUMER_CHAOS=P      each of a message's first three deliveries, with probability P/3
//	                              each, is nacked while its function runs; nacked instead of acked;
//	                              or neither acked nor nacked (redelivered after the ack wait)
//	EXAMPLE_CONSUMER_SEED=N       the chaos's random seed
type hooks struct {
	log     *slog.Logger
	hold    string // "", "ledger" or "ack"
	once    sync.Once
	release chan struct{} // a line on stdin

	mu    sync.Mutex
	rng   *rand.Rand // nil: no chaos
	chaos float64
}

// chaos kinds, as the log names them.
const (
	chaosNakMid  = "nak_mid"
	chaosLostAck = "lost_ack"
	chaosNoAck   = "no_ack"
)

// newHooks reads the hooks' environment variables.
func newHooks(log *slog.Logger) (*hooks, error) {
	h := &hooks{log: log, hold: os.Getenv("EXAMPLE_CONSUMER_HOLD"), release: make(chan struct{})}
	switch h.hold {
	case "", "ledger", "ack":
	default:
		return nil, fmt.Errorf("EXAMPLE_CONSUMER_HOLD=%q: want ledger or ack", h.hold)
	}
	if h.hold != "" {
		go func() {
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				h.release <- struct{}{}
			}
		}()
	}
	if s := os.Getenv("EXAMPLE_CONSUMER_CHAOS"); s != "" {
		p, err := strconv.ParseFloat(s, 64)
		if err != nil || p < 0 || p > 1 {
			return nil, fmt.Errorf("EXAMPLE_CONSUMER_CHAOS=%q: want a probability", s)
		}
		seed, _ := strconv.ParseUint(os.Getenv("EXAMPLE_CONSUMER_SEED"), 10, 64)
		h.rng, h.chaos = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), p
	}
	return h, nil
}

// at holds the first delivery to reach point; deliveries is its count.
func (h *hooks) at(ctx context.Context, point, key string, deliveries uint64) {
	if h.hold != point {
		return
	}
	first := false
	h.once.Do(func() { first = true })
	if !first {
		return
	}
	h.log.Info("hold", "point", point, "key", key, "deliveries", deliveries)
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// draw picks the chaos for a delivery: "" for none.
func (h *hooks) draw(deliveries uint64) string {
	if h.rng == nil || deliveries > 3 {
		return ""
	}
	h.mu.Lock()
	r := h.rng.Float64()
	h.mu.Unlock()
	switch {
	case r < h.chaos/3:
		return chaosNakMid
	case r < 2*h.chaos/3:
		return chaosLostAck
	case r < h.chaos:
		return chaosNoAck
	}
	return ""
}

// inLedgerWrite runs inside the function, its ledger row written and not
// committed.
func (h *hooks) inLedgerWrite(ctx context.Context, msg jetstream.Msg, key string) {
	var n uint64
	md, err := msg.Metadata()
	if err == nil {
		n = md.NumDelivered
	}
	h.at(ctx, "ledger", key, n)
	if err == nil && h.draw(n) == chaosNakMid {
		_ = msg.Nak() // redelivered at once, to whoever fetches, while this transaction is open
		h.log.Info("chaos", "kind", chaosNakMid, "key", key)
	}
}

// beforeAck runs before the ack of a delivery, its count deliveries.
func (h *hooks) beforeAck(key string, deliveries uint64) {
	h.at(context.Background(), "ack", key, deliveries)
}

// skipAck loses an ack on purpose: nacked instead, or left to the ack
// wait. It reports whether it did.
func (h *hooks) skipAck(msg jetstream.Msg, key string, deliveries uint64, attrs []any) bool {
	kind := h.draw(deliveries)
	switch kind {
	case chaosLostAck:
		_ = msg.Nak()
	case chaosNoAck:
	default:
		return false
	}
	h.log.Info("chaos", append(attrs, "kind", kind)...)
	return true
}
