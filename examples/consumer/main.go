// Command consumer settles payment messages from NATS JetStream with
// idempotency.Do: each payment's ledger entry is written once, however often
// the broker redelivers its message (docs/entry-points.md, "Consumers").
//
//	go run . -database postgres://postgres@127.0.0.1:5432/postgres
//	go run ./publish -n 10
//
// Each message is keyed by the id its publisher set (Nats-Msg-Id) and
// scoped by the payment's user. The operation is transactional: the ledger
// entry is written through the transaction Do lends the function, so the
// key's claim, the entry and the key's record commit together, and a
// consumer killed mid-message leaves nothing behind: the redelivery settles
// it, once. On SIGINT or SIGTERM it stops fetching and waits for the
// payments it holds, up to the lease.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/examples/consumer/payment"
	"github.com/idemkit/idempotency/migrations"
)

// options are the consumer's flags.
type options struct {
	natsURL       string
	databaseURL   string
	stream        string
	workers       int
	lease         time.Duration
	ackWait       time.Duration
	maxDeliveries uint64
	maxNakDelay   time.Duration
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.StringVar(&o.natsURL, "nats", envOr("NATS_URL", "nats://127.0.0.1:4222"), "the NATS server (NATS_URL)")
	fs.StringVar(&o.databaseURL, "database", os.Getenv("DATABASE_URL"), "PostgreSQL, for the ledger and the idempotency keys (DATABASE_URL)")
	fs.StringVar(&o.stream, "stream", "PAYMENTS", "the payment stream: payments on STREAM.settle, dead letters on STREAM.dead (stream STREAM_DEAD)")
	fs.IntVar(&o.workers, "workers", 4, "payments settled at once")
	fs.DurationVar(&o.lease, "lease", idempotency.DefaultLease, "how long a call owns its key (the function gets the lease less the store timeout); also the longest wait for calls at a stop")
	fs.DurationVar(&o.ackWait, "ack-wait", 0, "how long JetStream waits for an ack before it redelivers (default: the lease plus 5s, so a live call is never redelivered)")
	fs.Uint64Var(&o.maxDeliveries, "max-deliveries", 20, "deliveries of one message before it is dead-lettered instead of nacked")
	fs.DurationVar(&o.maxNakDelay, "max-nak-delay", 30*time.Second, "the longest delay of a nack (in flight waits the answer's retry delay, 5s, at most this)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.databaseURL == "":
		return o, errors.New("-database (or DATABASE_URL) is required")
	case o.workers < 1 || o.maxDeliveries < 1 || o.maxNakDelay <= 0 || o.lease <= idempotency.DefaultStoreTimeout:
		return o, errors.New("-workers and -max-deliveries must be at least 1, -max-nak-delay positive, -lease over the store timeout (2s)")
	}
	if o.ackWait == 0 {
		o.ackWait = o.lease + 5*time.Second
	}
	return o, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	o, err := parseFlags(os.Args[1:])
	if err == nil {
		err = run(log, o)
	}
	if err != nil {
		log.Error("consumer stopped", "error", err.Error())
		os.Exit(1)
	}
}

// run sets up the database and the broker, then consumes until a signal.
func run(log *slog.Logger, o options) error {
	h, err := newHooks(log)
	if err != nil {
		return err
	}
	setup, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := openDatabase(setup, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{Lease: o.lease, Logger: log})
	if err != nil {
		return err
	}
	// Transactional: the ledger entry commits with the key's record. The
	// longest TTL: a message may wait in the stream for days (a consumer
	// down over a weekend), and its key must outlive every redelivery.
	// Scoped: every call carries the payment's user, so message ids of two
	// users never meet. No FollowKillSwitch: FLAG_IDEMPOTENCY_MIDDLEWARE
	// is for HTTP endpoints, and a consumer that passed through would charge
	// every redelivery again.
	op, err := mw.Operation("settle-payment", idempotency.RouteConfig{Transactional: true, TTL: idempotency.MaxTTL, Scoped: true})
	if err != nil {
		return err
	}
	nc, js, err := payment.Connect(o.natsURL, "examples/consumer")
	if err != nil {
		return err
	}
	defer nc.Close()
	streams := payment.Streams{Name: o.stream}
	if err := streams.Ensure(setup, js); err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(setup, streams.Name, jetstream.ConsumerConfig{
		Durable:       payment.Durable,
		FilterSubject: streams.Subject(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       o.ackWait,
		MaxDeliver:    -1, // the consumer dead-letters at -max-deliveries: JetStream's own limit drops silently
	})
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", payment.Durable, streams.Name, err)
	}
	c := &consumer{js: js, streams: streams, op: op, np: nakPolicy{max: o.maxNakDelay},
		maxDeliveries: o.maxDeliveries, log: log, hooks: h}
	return consumeUntilSignal(c, cons, o)
}

// openDatabase connects, applies the library's migrations and creates the
// ledger; the pool has a connection for each worker's transaction and more.
func openDatabase(ctx context.Context, o options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("-database: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, int32(o.workers)+2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = migrations.Migrate(ctx, pool)
	if err == nil {
		err = idempotency.NewPostgresStore(pool).Check(ctx)
	}
	if err == nil {
		err = createLedger(ctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// consumeUntilSignal consumes until SIGINT or SIGTERM, then waits for the
// calls in progress up to the lease: Do runs them detached from any
// cancellation, so a stop never fails a key. A call still running after
// the lease is abandoned with the process: its transaction rolls back and
// JetStream redelivers the message.
func consumeUntilSignal(c *consumer, cons jetstream.Consumer, o options) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { c.run(cons, o.workers, stop); close(done) }()
	c.log.Info("consuming", "stream", c.streams.Name, "workers", o.workers, "ack_wait", o.ackWait.String())
	select {
	case s := <-sig:
		c.log.Info("stopping", "signal", s.String(), "wait", o.lease.String())
	case <-done:
		return errors.New("the workers stopped on their own")
	}
	close(stop)
	select {
	case <-done:
		c.log.Info("stopped")
		return nil
	case <-time.After(o.lease):
		return fmt.Errorf("calls still running after the lease (%s); their transactions roll back and JetStream redelivers them", o.lease)
	}
}
