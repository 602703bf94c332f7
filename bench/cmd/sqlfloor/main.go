// Command sqlfloor measures the floor under the middleware: the library's
// own claim and complete statements (idempotency.NewPostgresStore's Claim
// and Complete), issued straight through a pgx pool, with no HTTP and no
// handler, at the same concurrency and for the same time as loadgen. It
// prints the same SUMMARY line.
//
// It works in a schema of its own (-schema), dropped and created afresh and
// migrated with migrations.Migrate, and drops it again at the end unless
// -keep. The database must be on this machine (loopback or a socket).
//
// Modes:
//
//	unique  claim a new key, then complete it (a miss: what a new order costs the store)
//	claim   claim a new key and leave it in flight (the claim's share of a miss)
//	hot     claim a key that exists and is completed (a replay's store work)
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/bench/internal/result"
	"github.com/idemkit/idempotency/migrations"
)

// The recorded response: the size and shape of the example's order answer.
var (
	orderResponse = []byte(`{"id":123456,"symbol":"AAPL","side":"buy","qty":1,"status":"filled","fill_price":187.43,"client_order_id":"9b2f6a0e-7c1d-4e8a-b3f5-2d4c6e8a0b1c","created_at":"2026-01-02T03:04:05.678901Z"}`)
	orderHeader   = http.Header{"Content-Type": {"application/json"}, "Location": {"/api/trading/orders/123456"}}
)

const (
	endpoint     = "POST /api/trading/orders"
	scope        = "1"
	storeTimeout = 2 * time.Second
)

type options struct {
	dsn         string
	schema      string
	mode        string
	subject     string
	concurrency int
	poolSize    int
	duration    time.Duration
	warmup      time.Duration
	requests    int64
	keep        bool
	checkOnly   bool
	settle      time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL on this machine (env DATABASE_URL)")
	flag.StringVar(&o.schema, "schema", "idem_bench_floor", "schema to create, use and drop")
	flag.StringVar(&o.mode, "mode", "unique", "unique, claim or hot")
	flag.StringVar(&o.subject, "subject", "C", "label copied into the summary")
	flag.IntVar(&o.concurrency, "concurrency", 16, "concurrent workers")
	flag.IntVar(&o.poolSize, "pool", 20, "pool size cap (the example server's pool is 20); the pool is min(concurrency, pool)")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured window, after the warm-up (at most 10m)")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "load before the measured window, not counted")
	flag.Int64Var(&o.requests, "requests", 0, "stop after this many measured operations (0: no cap)")
	flag.BoolVar(&o.keep, "keep", false, "keep the schema afterwards")
	flag.DurationVar(&o.settle, "settle", 0, "before the load, wait up to this long for the cores to be under 30% busy (other work on the machine)")
	flag.BoolVar(&o.checkOnly, "check", false, "only check that the database URL is on this machine, then exit")
	flag.Parse()
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "sqlfloor:", err)
		os.Exit(2)
	}
	if o.checkOnly {
		if _, err := poolConfig(o); err != nil {
			fmt.Fprintln(os.Stderr, "sqlfloor:", err)
			os.Exit(2)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.settle+o.warmup+o.duration+2*time.Minute)
	defer cancel()
	s, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlfloor:", err)
		os.Exit(1)
	}
	fmt.Printf("%s floor %s: %d workers, %d operations in %.2fs: %.0f op/s\n", s.Subject, s.Mode, s.Concurrency, s.Requests, s.DurationS, s.RPS)
	fmt.Printf("  latency p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  errors %d  unexpected %d\n", s.P50Ms, s.P90Ms, s.P99Ms, s.MaxMs, s.Errors, s.Unexpected)
	if s.MachineBusyPct > 0 {
		fmt.Printf("  cpu per operation: sqlfloor %.0fus, rest of the machine (postgres...) %.0fus; cores busy %.0f%% (%.0f%% before the load)\n",
			s.CPULoadgenUs, s.CPUOtherUs, s.MachineBusyPct, s.BackgroundBusyPct)
	}
	s.Print(os.Stdout)
	if s.Errors > 0 || s.Unexpected > 0 || s.Requests == 0 {
		os.Exit(1)
	}
}

func (o options) check() error {
	switch {
	case o.dsn == "":
		return errors.New("no database: set -database-url or DATABASE_URL")
	case o.mode != "unique" && o.mode != "claim" && o.mode != "hot":
		return fmt.Errorf("-mode %q: want unique, claim or hot", o.mode)
	case o.concurrency < 1 || o.concurrency > 1024 || o.poolSize < 1:
		return errors.New("-concurrency must be 1 to 1024 and -pool positive")
	case o.duration <= 0 || o.warmup < 0 || o.warmup+o.duration > result.MaxDuration:
		return fmt.Errorf("-warmup plus -duration must be positive and at most %v", result.MaxDuration)
	case o.settle < 0 || o.settle > time.Minute:
		return errors.New("-settle must be 0 to 1m")
	case o.schema == "" || strings.ContainsAny(o.schema, `"`):
		return errors.New("-schema must be a plain name")
	}
	return nil
}

func connect(ctx context.Context, o options) (*pgxpool.Pool, error) {
	pc, err := poolConfig(o)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// poolConfig parses the database URL, refusing hosts off this machine.
func poolConfig(o options) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	hosts := []string{pc.ConnConfig.Host}
	for _, fb := range pc.ConnConfig.Fallbacks {
		hosts = append(hosts, fb.Host)
	}
	for _, h := range hosts {
		if !strings.HasPrefix(h, "/") { // a socket directory is local
			if err := result.CheckHost(h); err != nil {
				return nil, fmt.Errorf("database URL: %w", err)
			}
		}
	}
	pc.ConnConfig.DialFunc = result.DialLoopback
	pc.MaxConns = int32(min(o.concurrency, o.poolSize))
	pc.ConnConfig.RuntimeParams["search_path"] = o.schema
	return pc, nil
}

func run(ctx context.Context, o options) (result.Summary, error) {
	s := result.Summary{Tool: "sqlfloor", Subject: o.subject, Mode: o.mode, Concurrency: o.concurrency}
	pool, err := connect(ctx, o)
	if err != nil {
		return s, err
	}
	defer pool.Close()
	ident := pgx.Identifier{o.schema}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE; CREATE SCHEMA "+ident); err != nil {
		return s, fmt.Errorf("create schema %s: %w", o.schema, err)
	}
	if !o.keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if _, err := pool.Exec(dctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
				fmt.Fprintln(os.Stderr, "sqlfloor: drop schema:", err)
			}
		}()
	}
	if err := migrations.Migrate(ctx, pool); err != nil {
		return s, err
	}
	// Migrate closes the connections it borrowed; start the load on a
	// warm pool all the same.
	store := idempotency.NewPostgresStore(pool)
	resp := idempotency.Response{Status: http.StatusCreated, Header: orderHeader, Body: orderResponse, BodyKind: idempotency.BodyJSON}

	hot := newRequest()
	if o.mode == "hot" {
		res, err := store.Claim(ctx, hot)
		if err != nil || !res.Won {
			return s, fmt.Errorf("hot key: claim: won %v, %v", res.Won, err)
		}
		if err := store.Complete(ctx, res.Record.Fence(), res.Record, resp); err != nil {
			return s, fmt.Errorf("hot key: complete: %w", err)
		}
	}
	op := func(ctx context.Context) (ok bool, err error) {
		ctx, cancel := context.WithTimeout(ctx, storeTimeout)
		defer cancel()
		if o.mode == "hot" {
			res, err := store.Claim(ctx, hot)
			return err == nil && !res.Won && res.Record.Status == idempotency.StatusCompleted, err
		}
		res, err := store.Claim(ctx, newRequest())
		if err != nil || !res.Won || o.mode == "claim" {
			return err == nil && res.Won, err
		}
		return true, store.Complete(ctx, res.Record.Fence(), res.Record, resp)
	}

	s.BackgroundBusyPct = result.Settle(o.settle, 30)
	var cpu []result.CPUSample
	load := result.Load{
		Workers: o.concurrency, Warmup: o.warmup, Duration: o.duration, Requests: o.requests,
		AtStart: func() { cpu = append(cpu, result.SampleCPU(0)) },
		AtEnd:   func() { cpu = append(cpu, result.SampleCPU(0)) },
	}
	r := load.Run(ctx, func(ctx context.Context) result.Sample {
		switch ok, err := op(ctx); {
		case err != nil:
			return result.Sample{Outcome: result.Failed, Err: err}
		case !ok:
			return result.Sample{Outcome: result.Unexpected}
		}
		return result.Sample{Outcome: result.OK}
	})
	r.Fill(&s)
	if len(cpu) == 2 && s.Requests > 0 {
		result.FillCPU(&s, cpu[0], cpu[1], false)
	}
	if r.LastErr != nil {
		fmt.Fprintln(os.Stderr, "sqlfloor: last error:", r.LastErr)
	}
	return s, nil
}

// newRequest is a claim of a fresh key, as the order route makes it.
func newRequest() idempotency.ClaimRequest {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	key := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	sum := sha256.Sum256(b[:])
	return idempotency.ClaimRequest{
		Key:         key,
		Scope:       scope,
		Endpoint:    endpoint,
		RequestHash: hex.EncodeToString(sum[:]),
		TTL:         24 * time.Hour,
		Lease:       30 * time.Second,
	}
}
