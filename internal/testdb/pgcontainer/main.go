// Command pgcontainer starts a PostgreSQL container with testcontainers-go,
// prints its connection string as one line on stdout, and terminates the
// container when its stdin closes or it gets SIGTERM or SIGINT. The
// testdb package runs it when no IDEMPOTENCY_TEST_DATABASE_URL is set and a
// Docker engine answers; its stdin is a pipe from the test binary, so the
// container goes when the test binary goes, even when it crashes (and
// testcontainers' reaper, Ryuk, removes it if this program dies too).
//
// It is a module of its own so that testcontainers-go and the Docker client
// (with the OpenTelemetry modules they pull in) stay out of the root
// module's go.mod, and so out of every consumer's module graph.
//
// Usage:
//
//	pgcontainer [-image postgres:15-alpine] [-timeout 2m] [-v]
//
// Errors go to stderr, with exit status 1 (2 for bad flags).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	tclog "github.com/testcontainers/testcontainers-go/log"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// stopTimeout bounds terminating the container.
const stopTimeout = time.Minute

// options are the command line's settings.
type options struct {
	image   string        // PostgreSQL image
	timeout time.Duration // bound on starting the container
	verbose bool          // keep testcontainers' log on stderr
}

// startFunc starts a PostgreSQL container and returns its connection
// string and a function that terminates it. On error, anything it started
// is already terminated.
type startFunc func(ctx context.Context, o options) (dsn string, stop func(context.Context) error, err error)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, startPostgres))
}

// parseFlags reads the command line.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("pgcontainer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.image, "image", "postgres:15-alpine", "PostgreSQL image to run")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on pulling and starting the container")
	fs.BoolVar(&o.verbose, "v", false, "log testcontainers' steps on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("pgcontainer: unexpected argument %q", fs.Arg(0))
	}
	if o.image == "" || o.timeout <= 0 {
		return o, errors.New("pgcontainer: -image must not be empty and -timeout must be positive")
	}
	return o, nil
}

// run starts the container with start, prints its connection string on
// stdout and waits until stdin reaches its end (or fails) or ctx is done;
// then it terminates the container. It returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, start startFunc) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, err)
		}
		return 2
	}
	startCtx, cancel := context.WithTimeout(ctx, o.timeout)
	dsn, stop, err := start(startCtx, o)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "pgcontainer: start PostgreSQL container: %v\n", err)
		return 1
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(closed)
	}()
	w := bufio.NewWriter(stdout)
	_, err = fmt.Fprintln(w, dsn)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		select {
		case <-closed:
		case <-ctx.Done():
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if serr := stop(stopCtx); serr != nil {
		fmt.Fprintf(stderr, "pgcontainer: terminate container: %v\n", serr)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgcontainer: write connection string: %v\n", err)
		return 1
	}
	return 0
}

// startPostgres runs the container with testcontainers-go's postgres
// module, as the tests expect it: database idempotency_test, user and
// password postgres, no TLS.
func startPostgres(ctx context.Context, o options) (string, func(context.Context) error, error) {
	if !o.verbose {
		// testcontainers logs every step to stderr by default.
		tclog.SetDefault(tclog.NewNoopLogger())
	}
	c, err := tcpostgres.Run(ctx, o.image,
		tcpostgres.WithDatabase("idempotency_test"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		return "", nil, err
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = c.Terminate(context.Background())
		return "", nil, err
	}
	return dsn, func(ctx context.Context) error { return c.Terminate(ctx) }, nil
}
