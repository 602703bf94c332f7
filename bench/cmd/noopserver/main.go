// Command noopserver is bench/load.sh's subject N: one ordinary
// (non-transactional) route, fail-closed, behind the idempotency middleware
// with the Postgres store, whose handler does nothing but answer 201 with a
// small JSON body. What it serves per second is the middleware's and the
// store's cost alone, with no handler work to hide it (issue #13).
//
//	POST /noop     the route: 201 {"ok":true}, behind the middleware
//	GET  /healthz  200, not behind the middleware
//
// It uses the root package (Config, Route, PostgresStore) and its
// migrations package as a host would, with the example server's pool size,
// so that only the handler differs. Keys are scoped to "1": every request
// is the same user's. The kill-switch is the default (EnabledFromEnv).
//
// Flags: -addr (loopback only), -database-url (default $DATABASE_URL),
// -pprof, a loopback address to serve net/http/pprof on (profiling runs),
// -floor, which serves the route without the middleware, running the same
// statements by hand (subject N0, floor.go), and -pgbench-vars, which prints the pgbench -D variables (name=value, one
// a line) that make bench/cmd/pgbenchsql's miss.sql and hot.sql store the
// rows this route stores, and exits.
//
// With NOOP_BATCH_SLOTS set to a count, the store runs group commit with
// that many batch slots (PostgresStore.SetBatching(32, n); 0: off), so a
// slot count is measured without a build of its own (bench/groupcommit.sh's
// AFTER_ENV, BENCHMARKS.md "One slot, and the server's threads").
//
// With IDEMPOTENCY_SEAL_KEYS set (the example server's variable and format:
// ID:KEY entries, KEY the base64 of 32 bytes, the first active) the store
// seals each recorded response (idempotency.NewSealingStore), as the example
// server does: bench/load.sh -seal measures N sealed against N plain.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/bench/internal/result"
	"github.com/idemkit/idempotency/migrations"
)

// The route and its answer; bench/load.sh gives pgbench the same endpoint,
// scope, body and headers, so its scripts store the rows this route stores.
const (
	routePattern = "POST /noop"
	scope        = "1"
	answerBody   = `{"ok":true}`
	// answerHeaders is the response_headers value the middleware stores
	// for noop's answer (main_test.go checks it against the route's own
	// complete).
	answerHeaders = `{"Content-Type":["application/json"]}`
)

// pgbenchVars are the pgbench -D variables of this route's rows: its
// endpoint, scope, status, body and headers. The request hash, TTL, lease
// and owner token load.sh sets for every pgbench script alike.
var pgbenchVars = []string{
	"endpoint=" + routePattern,
	"scope=" + scope,
	"code=201",
	"body=" + answerBody,
	"headers=" + answerHeaders,
}

// poolConns is the example server's minimum pool size (minPoolConns in
// examples/server/postgres.go), so that N and A queue alike at 16 clients.
const poolConns = 20

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "address to listen on (loopback only)")
	dsn := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	pprofAddr := flag.String("pprof", "", "loopback address to serve net/http/pprof on (empty: none)")
	floorMode := flag.Bool("floor", false, "serve the route without the middleware: the same SQL by hand through pgx (subject N0)")
	sqlSrc := flag.String("sql-src", "internal/pgsql/pgsql.go", "with -floor: the root module's internal/pgsql/pgsql.go, whose statements the floor runs")
	vars := flag.Bool("pgbench-vars", false, "print the pgbench -D variables of this route's rows, one a line, and exit")
	flag.Parse()
	if *vars {
		for _, v := range pgbenchVars {
			fmt.Println(v)
		}
		return
	}
	floorSrc := ""
	if *floorMode {
		floorSrc = *sqlSrc
	}
	if err := run(*addr, *dsn, *pprofAddr, floorSrc); err != nil {
		fmt.Fprintln(os.Stderr, "noopserver:", err)
		os.Exit(1)
	}
}

// run serves the route with the middleware, or by hand with the
// statements of floorSrc when it is not empty (-floor).
func run(addr, dsn, pprofAddr, floorSrc string) error {
	if err := checkLoopback(addr); err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if dsn == "" {
		return errors.New("-database-url or DATABASE_URL is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var sealKeys idempotency.SealKeys
	if text := os.Getenv(envSealKeys); text != "" {
		if floorSrc != "" {
			return errors.New(envSealKeys + ": -floor does not seal")
		}
		var err error
		if sealKeys, err = idempotency.ParseSealKeys(text); err != nil {
			return fmt.Errorf("%s: %w", envSealKeys, err)
		}
	}
	slots := keepSlots
	if v, ok := os.LookupEnv(envBatchSlots); ok {
		if floorSrc != "" {
			return errors.New(envBatchSlots + ": -floor does not batch")
		}
		var err error
		if slots, err = batchSlots(v); err != nil {
			return err
		}
	}
	pool, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	var h http.Handler
	if floorSrc != "" {
		h, err = newFloorHandler(ctx, pool, floorSrc)
	} else {
		h, err = newHandler(ctx, pool, slog.New(slog.NewTextHandler(os.Stderr, nil)), sealKeys, slots)
	}
	if err != nil {
		return err
	}
	if pprofAddr != "" {
		if err := servePprof(pprofAddr); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// connect opens the pool, sized like the example server's, and waits for
// the database.
func connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, poolConns)
	}
	if h := pc.ConnConfig.Host; !strings.HasPrefix(h, "/") {
		if err := result.CheckHost(h); err != nil {
			return nil, fmt.Errorf("database URL: %w", err)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// envSealKeys is the example server's variable of the seal keys.
const envSealKeys = "IDEMPOTENCY_SEAL_KEYS"

// envBatchSlots sets the store's batch slots (batchSlots' format); unset,
// the store keeps its defaults (keepSlots).
const envBatchSlots = "NOOP_BATCH_SLOTS"

// keepSlots is newHandler's slots when NOOP_BATCH_SLOTS is unset: the
// store's defaults.
const keepSlots = -1

// batchMax is the calls of each kind a round carries under
// NOOP_BATCH_SLOTS: the store's default cap.
const batchMax = 32

// batchSlots reads NOOP_BATCH_SLOTS: a count of slots from 0 (group
// commit off) to 64.
func batchSlots(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 64 {
		return 0, fmt.Errorf("%s=%q: want a count of batch slots from 0 (off) to 64", envBatchSlots, v)
	}
	return n, nil
}

// newHandler migrates the pool's schema (as the example server does at
// start-up), checks it, and returns the server's routes; with sealKeys
// (nil: none) the store seals the responses it records, and with slots
// other than keepSlots it has that many batch slots.
func newHandler(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, sealKeys idempotency.SealKeys, slots int) (http.Handler, error) {
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := migrations.Migrate(mctx, pool); err != nil {
		return nil, err
	}
	pg := idempotency.NewPostgresStore(pool)
	if slots != keepSlots {
		pg.SetBatching(batchMax, slots) // before Check, which turns it off on Citus
	}
	if err := pg.Check(mctx); err != nil {
		return nil, err
	}
	var store idempotency.Store = pg
	if sealKeys != nil {
		var err error
		if store, err = idempotency.NewSealingStore(mctx, pg, sealKeys); err != nil {
			return nil, err
		}
		log.Info("sealing stored responses")
	}
	idem, err := idempotency.New(store, idempotency.Config{
		Scope:  func(context.Context) string { return scope },
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	// The zero RouteConfig: fail-closed, not transactional, the default
	// TTL; the endpoint is the ServeMux pattern.
	route, err := idem.Route(idempotency.RouteConfig{})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(routePattern, route(http.HandlerFunc(noop)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	return mux, nil
}

// noop is the handler: no work, a small JSON answer.
func noop(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(answerBody))
}

// servePprof serves net/http/pprof on a loopback address, apart from the
// measured listener.
func servePprof(addr string) error {
	if err := checkLoopback(addr); err != nil {
		return fmt.Errorf("-pprof: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go func() { _ = http.Serve(ln, mux) }()
	return nil
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	return result.CheckHost(host)
}
