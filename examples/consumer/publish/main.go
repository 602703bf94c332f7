// Command publish publishes payment messages for the example consumer, each
// with its payment id as its Nats-Msg-Id (the consumer's idempotency key),
// and prints one line per payment: its id, user and amount.
//
//	go run ./publish -n 10 -users 3
//	go run ./publish -id pay-1 -user user-1 -amount 1250   # again: the same payment, replayed
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/examples/consumer/payment"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	natsURL := fs.String("nats", envOr("NATS_URL", "nats://127.0.0.1:4222"), "the NATS server (NATS_URL)")
	stream := fs.String("stream", "PAYMENTS", "the payment stream (the consumer's -stream)")
	n := fs.Int("n", 1, "how many payments")
	users := fs.Int("users", 1, "spread them over this many users (user-1, user-2, ...)")
	id := fs.String("id", "", "the payment id, for -n 1 (default: pay-<uuid>); publishing an id again is a redelivery")
	user := fs.String("user", "", "the user, for -n 1 (default: user-1 ...)")
	amount := fs.Int64("amount", 1250, "the amount, in cents (0 or less is declined)")
	currency := fs.String("currency", "EUR", "the currency (EUR, USD and GBP are booked; others declined)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *users < 1 || (*n > 1 && (*id != "" || *user != "")) {
		return errors.New("-n and -users must be at least 1; -id and -user go with -n 1")
	}
	nc, js, err := payment.Connect(*natsURL, "examples/consumer/publish")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	streams := payment.Streams{Name: *stream}
	if err := streams.Ensure(ctx, js); err != nil {
		return err
	}
	for i := range *n {
		p := payment.Payment{ID: *id, UserID: *user, AmountCents: *amount, Currency: *currency}
		if p.ID == "" {
			p.ID = "pay-" + uuid.NewString()
		}
		if p.UserID == "" {
			p.UserID = fmt.Sprintf("user-%d", i%*users+1)
		}
		dup, err := streams.Publish(ctx, js, p)
		if err != nil {
			return err
		}
		note := ""
		if dup {
			note = " (JetStream dropped it: the same id within its duplicate window)"
		}
		fmt.Printf("%s %s %d %s%s\n", p.ID, p.UserID, p.AmountCents, p.Currency, note)
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
