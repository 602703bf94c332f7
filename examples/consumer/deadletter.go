package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/examples/consumer/payment"
)

// deadLetter publishes the delivery to the dead-letter stream with its
// reason, waits for the stream to store it, and only then terminates the
// original (Term: never redelivered). A crash between the two redelivers
// the message, which is dead-lettered again: the dead letter's Nats-Msg-Id
// is the original's stream sequence, so JetStream stores it once. JetStream
// has no dead-letter queue of its own (its MaxDeliver only stops
// deliveries, silently), hence this stream.
func (c *consumer) deadLetter(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, key string, v verdict) error {
	dead := nats.NewMsg(c.streams.DeadSubject())
	dead.Data = msg.Data()
	for name, values := range msg.Headers() {
		if name != jetstream.MsgIDHeader {
			dead.Header[name] = values
		}
	}
	dead.Header.Set(payment.HeaderReason, v.answer)
	if v.err != nil {
		dead.Header.Set(payment.HeaderError, strings.NewReplacer("\r", " ", "\n", " ").Replace(v.err.Error())) // a header is one line
	}
	dead.Header.Set(payment.HeaderSequence, strconv.FormatUint(meta.Sequence.Stream, 10))
	dead.Header.Set(payment.HeaderDeliveries, strconv.FormatUint(meta.NumDelivered, 10))
	if key != "" {
		dead.Header.Set(payment.HeaderMsgID, key)
	}
	id := fmt.Sprintf("%s-%d", meta.Stream, meta.Sequence.Stream)
	if _, err := c.js.PublishMsg(ctx, dead, jetstream.WithMsgID(id), jetstream.WithExpectStream(c.streams.DeadStream())); err != nil {
		return err
	}
	return msg.Term()
}
