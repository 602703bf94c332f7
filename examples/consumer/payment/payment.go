// Package payment is what the example consumer and its publisher share: the
// payment message, the JetStream streams it travels on, and how it is
// published (with the id the consumer keys its idempotency on).
package payment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Payment is one payment message's body.
type Payment struct {
	ID          string `json:"id"`      // also the message's Nats-Msg-Id
	UserID      string `json:"user_id"` // the call's scope: erase --user finds the key's row by it
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Streams names the JetStream streams of one payment flow: Name holds the
// payments on Name.settle; Name_DEAD holds the dead letters on Name.dead.
type Streams struct {
	Name string // a stream name: letters, digits, '-' and '_'
}

// Subject is where payments are published.
func (s Streams) Subject() string { return s.Name + ".settle" }

// DeadSubject is where the consumer dead-letters what it cannot settle.
func (s Streams) DeadSubject() string { return s.Name + ".dead" }

// DeadStream is the name of the dead-letter stream.
func (s Streams) DeadStream() string { return s.Name + "_DEAD" }

// Durable is the name of the consumer every consumer process shares: each
// payment goes to one of them at a time.
const Durable = "settle"

// Ensure creates both streams unless they exist (an existing stream's
// configuration is left as it is). Both keep what they hold on disk, and
// JetStream drops a publish whose Nats-Msg-Id it saw within the duplicate
// window (2 minutes): a publisher's quick retries store one message, and
// the consumer's idempotency covers whatever comes later.
func (s Streams) Ensure(ctx context.Context, js jetstream.JetStream) error {
	for _, cfg := range []jetstream.StreamConfig{
		{Name: s.Name, Subjects: []string{s.Subject()}, Storage: jetstream.FileStorage},
		{Name: s.DeadStream(), Subjects: []string{s.DeadSubject()}, Storage: jetstream.FileStorage},
	} {
		_, err := js.CreateStream(ctx, cfg)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// Publish publishes p on s with p.ID as its Nats-Msg-Id and waits for the
// stream's acknowledgement: duplicate reports a publish JetStream dropped
// as one it had already stored.
func (s Streams) Publish(ctx context.Context, js jetstream.JetStream, p Payment) (duplicate bool, err error) {
	body, err := json.Marshal(p)
	if err != nil {
		return false, err
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: s.Subject(), Data: body},
		jetstream.WithMsgID(p.ID), jetstream.WithExpectStream(s.Name))
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", p.ID, err)
	}
	return ack.Duplicate, nil
}

// Dead-letter headers: why a message was dead-lettered, and where it came
// from. Its own headers are kept; its Nats-Msg-Id moves to HeaderMsgID.
const (
	HeaderReason     = "Dead-Letter-Reason"     // an answer name, e.g. previous_failed
	HeaderError      = "Dead-Letter-Error"      // the error in words
	HeaderSequence   = "Dead-Letter-Sequence"   // the payment stream's sequence number
	HeaderDeliveries = "Dead-Letter-Deliveries" // how many times it was delivered
	HeaderMsgID      = "Dead-Letter-Msg-Id"     // the original Nats-Msg-Id, if it had one
)

// Connect connects to the NATS server at url, reconnecting for ever.
func Connect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("nats %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
