// Package testdb gives each test its own PostgreSQL schema, so Postgres tests
// run in parallel, across packages too, and leave nothing behind.
//
// The server is found in this order: the IDEMPOTENCY_TEST_DATABASE_URL
// variable; else a PostgreSQL container when a Docker engine answers
// (started with testcontainers-go by the pgcontainer program, a module of
// its own, so that testcontainers stays out of the root go.mod); else the
// test is skipped with one line naming the variable, or fails when
// IDEMPOTENCY_REQUIRE_DB=1 (as in CI).
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/migrations"
)

// Environment variables read by this package.
const (
	// EnvURL names the server to test against, e.g.
	// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
	EnvURL = "IDEMPOTENCY_TEST_DATABASE_URL"
	// EnvRequire set to 1 turns "no database" from a skip into a failure.
	EnvRequire = "IDEMPOTENCY_REQUIRE_DB"
)

// DefaultMaxConns is the size of each test's pool unless MaxConns says
// otherwise. Tests run in parallel, packages too, against a server that
// allows 100 connections by default: 8 per pool leaves room for about ten
// pools at once.
const DefaultMaxConns = 8

// setupTimeout bounds creating or dropping a schema and migrating it.
const setupTimeout = 30 * time.Second

// Option adjusts the pool a test gets.
type Option func(*pgxpool.Config)

// MaxConns sets the pool's maximum number of connections. Defaults to
// DefaultMaxConns.
func MaxConns(n int32) Option {
	return func(c *pgxpool.Config) { c.MaxConns = n }
}

// Tracer sets a pgx query tracer on the pool's connections.
func Tracer(tr pgx.QueryTracer) Option {
	return func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr }
}

// Configure lets a test change anything else in the pool's configuration,
// such as ConnConfig.DialFunc or Host and Port to go through a proxy. The
// schema's search_path is already set in ConnConfig.RuntimeParams.
func Configure(f func(*pgxpool.Config)) Option {
	return func(c *pgxpool.Config) { f(c) }
}

// New returns a pool whose connections use a new, empty schema with the
// idempotency migrations applied (migrations.Migrate). The schema is
// dropped, and the pool closed, when the test and its subtests end. Without
// a database it skips the test, or fails it when IDEMPOTENCY_REQUIRE_DB=1.
func New(tb testing.TB, opts ...Option) *pgxpool.Pool {
	tb.Helper()
	pool := NewEmpty(tb, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.Migrate(ctx, pool); err != nil {
		tb.Fatalf("testdb: migrate schema: %v", err)
	}
	return pool
}

// NewEmpty is New without the migrations: the schema has no tables.
func NewEmpty(tb testing.TB, opts ...Option) *pgxpool.Pool {
	tb.Helper()
	base := serverURL(tb)
	schema := newSchema(tb, base)
	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	delete(cfg.ConnConfig.RuntimeParams, "options") // an options=-csearch_path=... would override ours
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = DefaultMaxConns
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// The pool NewPostgresStore expects (it warns about one without).
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	for _, o := range opts {
		o(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("testdb: open pool: %v", err)
	}
	// Cleanups run last-registered first: the pool closes before its
	// schema is dropped.
	tb.Cleanup(pool.Close)
	return pool
}

// NewDSN returns a connection string whose connections use a new, migrated
// schema (through a search_path option), for tests that start other
// processes or open their own pools. The schema is dropped when the test
// ends.
func NewDSN(tb testing.TB) string {
	tb.Helper()
	pool := NewEmpty(tb, MaxConns(2))
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.Migrate(ctx, pool); err != nil {
		tb.Fatalf("testdb: migrate schema: %v", err)
	}
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	pool.Close()
	u, err := url.Parse(serverURL(tb))
	if err != nil {
		tb.Fatalf("testdb: parse server URL: %v", err)
	}
	q := u.Query()
	q.Del("search_path")
	q.Set("options", "-csearch_path="+schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// ServerURL returns the URL of the test server itself (no schema of its
// own), skipping or failing the test as New does when there is none.
func ServerURL(tb testing.TB) string {
	tb.Helper()
	return serverURL(tb)
}

// newSchema creates a schema with a random name on the server at base and
// registers its removal.
func newSchema(tb testing.TB, base string) string {
	tb.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "idem_test_" + hex.EncodeToString(b[:])
	if err := adminExec(base, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("testdb: create schema: %v", err)
	}
	tb.Cleanup(func() {
		if err := adminExec(base, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			tb.Errorf("testdb: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// adminExec runs one statement on a connection of its own, so that no pool
// (and no pool goroutine) outlives the tests.
func adminExec(base, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// serverURL resolves the server: the variable, else a container, else skip
// (or fail when required).
func serverURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	u, err := containerURL()
	if err == nil {
		return u
	}
	msg := fmt.Sprintf("testdb: no PostgreSQL: set %s (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) or start Docker (%v)", EnvURL, err)
	if os.Getenv(EnvRequire) == "1" {
		tb.Fatal(msg)
	}
	Skip(tb, "no PostgreSQL: set "+EnvURL+" or start Docker", msg)
	return ""
}

// M is the part of *testing.M that Main needs.
type M interface{ Run() int }

// Main wraps a package's *testing.M so that the container and the PgBouncer
// testdb may have started are stopped once the package's tests have run,
// before a leak check looks for goroutines:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }
//
// Without it the container is removed when the test binary exits (the
// pgcontainer program sees its stdin close), and PgBouncer is killed with
// the binary (Linux).
func Main(m M) M { return mainWrapper{m} }

type mainWrapper struct{ m M }

func (w mainWrapper) Run() int {
	code := w.m.Run()
	stopPgBouncer()
	stopContainer()
	return code
}
