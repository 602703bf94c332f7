// Command venue is a paper broker over HTTP: the downstream the example
// server's live mode sends its orders to, and the venue the library's
// downstream tests (TestVenue...) fail on purpose.
//
// It speaks a subset of a common retail-broker REST API, exactly the one
// DESIGN-settled-r4.md item 32 fixes, and nothing else:
//
//	POST /v2/orders
//	    {"symbol":"AAPL","qty":"3","side":"buy","type":"market",
//	     "time_in_force":"day","client_order_id":"..."}
//	    200 the order: {"id", "client_order_id", "symbol", "qty", "side",
//	        "status":"filled", "filled_qty", "filled_avg_price",
//	        "created_at", "filled_at"}
//	    422 {"code":40010001,"message":"client_order_id must be unique"}
//	        when the client_order_id is already booked: nothing is booked
//	    422 {"code":40010000,"message":"..."} for an invalid order
//	GET /v2/orders:by_client_order_id?client_order_id=X
//	    200 the order, or 404 {"code":40410000,"message":"order not found"}
//
// Every accepted order fills at once, whole, at a price fixed per symbol.
// The order book is a file of JSON lines (-book), written and fsynced
// before an order is answered and read back at start, so a crash keeps
// every order the venue accepted. APCA-API-KEY-ID and APCA-API-SECRET-KEY
// headers are accepted and ignored.
//
// Faults, for the tests of what sits in front of it, are switched by flags
// at start or by the control endpoint:
//
//	drop          book the order, then close the connection without answering
//	delay         book the order, then answer after -delay
//	5xx           answer 503 before booking anything
//	crash-before  exit at once (status 3) before booking
//	crash-after   book the order (fsynced), then exit at once (status 3)
//
// A fault hits the next -fault-count orders (0: every order). drop, delay
// and crash-after hit only orders that book: a duplicate is refused as
// usual. -hold makes every order wait that long after it is read, before
// anything else, so a test can act while the venue holds it; setting the
// faults again releases the orders held.
//
//	GET  /control/faults    the faults in force and the order counters
//	POST /control/faults    {"fault":"drop","count":1,"delay":"3s","hold":"1s"}
//	GET  /control/orders    {"orders":[...]}: the whole book, oldest first
//
// Flags (each also an environment variable; the flag wins): -addr (ADDR,
// default 127.0.0.1:8090), -book (VENUE_BOOK, default venue-orders.jsonl),
// -fault (VENUE_FAULT), -fault-count (VENUE_FAULT_COUNT), -delay
// (VENUE_DELAY), -hold (VENUE_HOLD). Logs go to stderr as JSON, the first
// line "listening" with the address. It uses the standard library only.
//
//	go run ./examples/venue -book /tmp/venue.jsonl
//	VENUE_URL=http://127.0.0.1:8090 go run ./examples/server    # live mode
//
// docs/live-trading.md describes the live mode in full.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment variables read by the venue; the flags have the same names in
// lower case with dashes, without the VENUE_ prefix.
const (
	envAddr       = "ADDR"
	envBook       = "VENUE_BOOK"
	envFault      = "VENUE_FAULT"
	envFaultCount = "VENUE_FAULT_COUNT"
	envDelay      = "VENUE_DELAY"
	envHold       = "VENUE_HOLD"
)

// crashStatus is the exit status of a crash fault.
const crashStatus = 3

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "venue: %v\n", err)
		os.Exit(2)
	}
}

// config is the venue's configuration.
type config struct {
	addr   string
	book   string
	faults faults
}

// parseConfig reads the flags, then the environment for each flag not
// given.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var cfg config
	var fault, count, delay, hold string
	fs := flag.NewFlagSet("venue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8090", "listen address, host:port (env "+envAddr+")")
	fs.StringVar(&cfg.book, "book", "venue-orders.jsonl", "the order book's file, created when missing (env "+envBook+")")
	fs.StringVar(&fault, "fault", "", "drop, delay, 5xx, crash-before or crash-after; empty: none (env "+envFault+")")
	fs.StringVar(&count, "fault-count", "0", "how many orders the fault hits; 0: every order (env "+envFaultCount+")")
	fs.StringVar(&delay, "delay", "0s", "how late the delay fault answers (env "+envDelay+")")
	fs.StringVar(&hold, "hold", "0s", "how long every order waits before anything else (env "+envHold+")")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q: the venue takes flags only", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, v := range []struct {
		name, env string
		dst       *string
	}{
		{"addr", envAddr, &cfg.addr}, {"book", envBook, &cfg.book}, {"fault", envFault, &fault},
		{"fault-count", envFaultCount, &count}, {"delay", envDelay, &delay}, {"hold", envHold, &hold},
	} {
		if e := strings.TrimSpace(getenv(v.env)); !given[v.name] && e != "" {
			*v.dst = e
		}
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 {
		return cfg, fmt.Errorf("-fault-count (%s) must be a whole number >= 0, got %q", envFaultCount, count)
	}
	cfg.faults, err = parseFaults(faultSetting{Fault: fault, Count: n, Delay: delay, Hold: hold})
	if err != nil {
		return cfg, err
	}
	if _, _, err := net.SplitHostPort(cfg.addr); err != nil {
		return cfg, fmt.Errorf("invalid -addr (%s) %q: want host:port", envAddr, cfg.addr)
	}
	return cfg, nil
}

// run is the whole program: it loads the book, serves until ctx is done,
// then shuts down.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	book, err := openBook(cfg.book)
	if err != nil {
		return err
	}
	defer book.close()
	v := newVenue(book, cfg.faults, log)
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	hs := &http.Server{Handler: v, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("listening", "addr", ln.Addr().String(), "book", cfg.book, "orders", book.len(), "fault", cfg.faults.setting())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	log.Info("stopped")
	return nil
}
