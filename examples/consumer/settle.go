package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/examples/consumer/payment"
)

// consumer settles payment messages with Do, one delivery at a time per
// worker.
type consumer struct {
	js            jetstream.JetStream
	streams       payment.Streams
	op            *idempotency.Operation // transactional: the ledger entry commits with the key's record
	np            nakPolicy
	maxDeliveries uint64 // a delivery past it is dead-lettered instead of nacked or run
	log           *slog.Logger
	hooks         *hooks
}

// brokerTimeout bounds each ack, nack and dead-letter publish.
const brokerTimeout = 5 * time.Second

// handle settles one delivery and does what its verdict says.
func (c *consumer) handle(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil { // not a JetStream delivery: nothing to ack or nack it with
		c.log.Error("not a JetStream message; ignored", "subject", msg.Subject(), "error", err)
		return
	}
	key := msg.Headers().Get(jetstream.MsgIDHeader)
	v, ledgerID := c.settle(msg, meta, key)
	c.perform(msg, meta, key, v, ledgerID)
}

// settle runs the payment's Do call and judges its answer.
func (c *consumer) settle(msg jetstream.Msg, meta *jetstream.MsgMetadata, key string) (v verdict, ledgerID int64) {
	if key == "" {
		return verdict{act: deadLetter, answer: "no_message_id", err: errors.New("the publisher set no Nats-Msg-Id, the payment's idempotency key")}, 0
	}
	if meta.NumDelivered > c.maxDeliveries { // it crashed or timed out every consumer that took it
		return verdict{act: deadLetter, answer: "redelivery_limit", err: fmt.Errorf("delivered %d times", meta.NumDelivered)}, 0
	}
	var p payment.Payment
	if err := json.Unmarshal(msg.Data(), &p); err != nil || p.UserID == "" || p.ID != key {
		return verdict{act: deadLetter, answer: "malformed_body", err: fmt.Errorf("not a payment with a user_id and the message's id as its id (json: %v)", err)}, 0
	}
	defer func() {
		if r := recover(); r != nil { // Do recorded the key failed before it re-raised
			v = verdict{act: deadLetter, answer: "panic", err: fmt.Errorf("the function panicked: %v", r)}
		}
	}()
	r, info, err := idempotency.Do(context.Background(), c.op,
		idempotency.Call{Key: key, Scope: p.UserID, Request: msg.Data()},
		func(ctx context.Context) (receipt, error) {
			rejected := decline(p)
			id, err := book(ctx, p, rejected)
			if err != nil {
				if transient(err) {
					return receipt{}, idempotency.Retryable(err)
				}
				return receipt{}, err
			}
			c.hooks.inLedgerWrite(ctx, msg, key)
			if rejected != nil {
				return receipt{}, rejected // its writes commit: the decline is booked once
			}
			return receipt{LedgerID: id}, nil
		})
	return c.np.judge(info, err, meta.NumDelivered), r.LedgerID
}

// perform acks, nacks or dead-letters the delivery and logs what it did:
// INFO for an ack or a nack, ERROR for a dead letter. A nack past the
// delivery limit becomes a dead letter: nothing is requeued for ever.
func (c *consumer) perform(msg jetstream.Msg, meta *jetstream.MsgMetadata, key string, v verdict, ledgerID int64) {
	if v.act == nak && meta.NumDelivered >= c.maxDeliveries {
		v = verdict{act: deadLetter, answer: "redelivery_limit", err: fmt.Errorf("delivered %d times, last answer %s: %w", meta.NumDelivered, v.answer, v.err)}
	}
	attrs := []any{"key", key, "seq", meta.Sequence.Stream, "deliveries", meta.NumDelivered, "answer", v.answer}
	if v.err != nil {
		attrs = append(attrs, "error", v.err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), brokerTimeout)
	defer cancel()
	switch v.act {
	case ack:
		if c.hooks.skipAck(msg, key, meta.NumDelivered, attrs) {
			return
		}
		c.hooks.beforeAck(key, meta.NumDelivered)
		if err := msg.DoubleAck(ctx); err != nil { // the redelivery replays
			attrs = append(attrs, "ack_error", err.Error())
		}
		c.log.Info("payment", append(attrs, "verdict", "ack", "ledger_id", ledgerID)...)
	case nak:
		if err := msg.NakWithDelay(v.delay); err != nil { // redelivered after the ack wait instead
			attrs = append(attrs, "nak_error", err.Error())
		}
		c.log.Info("payment", append(attrs, "verdict", "nak", "delay_ms", v.delay.Milliseconds())...)
	case deadLetter:
		if err := c.deadLetter(ctx, msg, meta, key, v); err != nil {
			_ = msg.NakWithDelay(c.np.max) // never dropped: it comes back and is dead-lettered again
			c.log.Error("payment: dead-letter publish failed; redelivering", append(attrs, "verdict", "nak", "dead_letter_error", err.Error())...)
			return
		}
		c.log.Error("payment", append(attrs, "verdict", "dead_letter")...)
	}
}
