// Command client places paper-trading orders against the example server
// (examples/server) through a lossy proxy of its own, with idemclient's
// Transport, and shows that every order is placed exactly once although
// the proxy drops requests, loses and cuts answers and holds them back.
//
//	go run ./examples/server &
//	go run ./examples/client -server http://127.0.0.1:8080
//
// Run the server with -order-latency 1500ms to see an attempt time out
// while its order is still running: the retry is answered 409
// idempotency_in_flight, and the client waits for its Retry-After.
//
// Each order gets its key before its first attempt (idemclient.WithKey),
// as a program that stores pending orders would do. At the end the client
// lists the user's orders straight from the server (not through the proxy)
// and checks that each order it placed is there once, and nothing else;
// it exits 1 when not.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	server         string
	orders         int
	faultRate      float64
	delay          time.Duration
	attemptTimeout time.Duration
	seed           uint64
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.server, "server", "http://127.0.0.1:8080", "base URL of the example server")
	fs.IntVar(&o.orders, "orders", 10, "how many orders to place")
	fs.Float64Var(&o.faultRate, "faults", 0.3, "share of requests (0 to 1) the proxy drops, loses, cuts or delays")
	fs.DurationVar(&o.delay, "delay", 1500*time.Millisecond, "how long the proxy holds back a delayed answer")
	fs.DurationVar(&o.attemptTimeout, "attempt-timeout", time.Second, "how long one attempt waits for an answer's head")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed of the proxy's faults")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.orders < 1:
		return o, errors.New("-orders must be at least 1")
	case o.faultRate < 0 || o.faultRate > 1:
		return o, errors.New("-faults must be from 0 to 1")
	case o.delay < 0 || o.attemptTimeout <= 0:
		return o, errors.New("-delay must not be negative, -attempt-timeout must be positive")
	}
	return o, nil
}
