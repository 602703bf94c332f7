// Command server is the idempotency library's example: a small
// paper-trading API whose order route is wrapped fail-closed (and
// transactional on PostgreSQL) and whose billing route is wrapped fail-open.
//
//	go run ./examples/server                     # everything in memory
//	DATABASE_URL=postgres://... go run ./examples/server
//
// Run it with -h for the flags; WALKTHROUGH.md shows a session with curl.
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
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and returns the process's exit status: 0
// for success, 2 for a usage error, 1 for anything else.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "server: %v\nRun 'server -h' for the flags.\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "server: %v\n", err)
		return 1
	}
}

// run is the whole program: it parses args and the environment (through
// getenv), serves until ctx is done, then drains in-flight requests. Logs
// go to stderr as JSON; -h prints the usage to stdout.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout)
		return nil
	}
	if err != nil {
		return err
	}
	cfg.logger = slog.New(slog.NewJSONHandler(stderr, nil))
	return serve(ctx, cfg)
}

// serve builds the server, listens on cfg.addr and serves until ctx is
// done. Then it stops accepting and gives in-flight requests up to the lease
// to finish: a claimed order completes and its key is recorded, rather than
// being cut off and left in flight.
func serve(ctx context.Context, cfg config) error {
	log := cfg.logger
	srv, cleanup, err := newServer(ctx, cfg)
	if err != nil {
		log.Error("start-up failed", "error", err)
		return err
	}
	defer cleanup()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		log.Error("start-up failed", "error", err)
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A keyed order may run for the lease, and a pass-through one
		// for the simulated latency; the answer must still go out.
		WriteTimeout:   max(cfg.lease, cfg.orderLatency) + 30*time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	attrs := []any{"addr", ln.Addr().String(), "store", srv.mode,
		"lease", cfg.lease.String(), "store_timeout", cfg.storeTimeout.String(),
		"order_latency", cfg.orderLatency.String()}
	if cfg.venueURL != "" {
		attrs = append(attrs, "venue", cfg.venueURL) // live mode
	}
	log.Info("listening", attrs...)

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		log.Error("server failed", "error", err)
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	log.Info("shutting down: draining in-flight requests", "limit", cfg.lease.String())
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.lease)
	defer cancel()
	if err := hs.Shutdown(drainCtx); err != nil {
		log.Warn("drain limit reached; closing the remaining connections", "error", err)
		_ = hs.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		log.Warn("serve returned", "error", err)
	}
	log.Info("stopped")
	return nil
}
