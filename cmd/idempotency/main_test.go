package main

import (
	"bytes"
	"context"
	"database/sql"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m))
}

// result is what one run of the CLI produced.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the CLI in-process with env as its whole environment.
func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, &out, &errOut, func(k string) string { return env[k] })
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// runDB runs the CLI against dsn (passed as --database-url).
func runDB(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	return runCLI(t, nil, append([]string{"--database-url", dsn}, args...)...)
}

// wantCode fails the test unless r exited with code.
func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// testDB is a fresh migrated schema: its DSN for the CLI and a store on it
// to make rows with.
type testDB struct {
	dsn   string
	pool  *pgxpool.Pool     // PostgreSQL
	sqlDB *sql.DB           // MySQL/MariaDB (newMySQLTestDB)
	store idempotency.Store // on pool or on sqlDB
}

func newTestDB(t *testing.T) testDB {
	t.Helper()
	dsn := testdb.NewDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return testDB{dsn: dsn, pool: pool, store: idempotency.NewPostgresStore(pool)}
}

// claim stores an in_flight key and returns its record.
func (db testDB) claim(t *testing.T, key, user, endpoint string, ttl, lease time.Duration) idempotency.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := db.store.Claim(ctx, idempotency.ClaimRequest{
		Key: key, Scope: user, Endpoint: endpoint,
		RequestHash: strings.Repeat("ab", 32), TTL: ttl, Lease: lease,
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if !res.Won {
		t.Fatalf("claim of %s %q %q lost", key, user, endpoint)
	}
	return res.Record
}

// complete claims a key and records resp for it.
func (db testDB) complete(t *testing.T, key, user, endpoint string, ttl time.Duration, resp idempotency.Response) {
	t.Helper()
	rec := db.claim(t, key, user, endpoint, ttl, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.store.Complete(ctx, rec.Fence(), rec, resp); err != nil {
		t.Fatalf("complete: %v", err)
	}
}

// fail claims a key and marks it failed.
func (db testDB) fail(t *testing.T, key, user, endpoint string, ttl time.Duration) {
	t.Helper()
	rec := db.claim(t, key, user, endpoint, ttl, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.store.Fail(ctx, rec.Fence()); err != nil {
		t.Fatalf("fail: %v", err)
	}
}

// count returns the number of rows matching where.
func (db testDB) count(t *testing.T, where string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	q := "SELECT count(*) FROM idempotency_keys WHERE " + where
	var err error
	if db.sqlDB != nil {
		err = db.sqlDB.QueryRowContext(ctx, mysqlWhere(q), args...).Scan(&n)
	} else {
		err = db.pool.QueryRow(ctx, q, args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

// waitRows polls until want rows match where, by the database's clock (rows
// made with a 1ms TTL or lease expire a moment later).
func (db testDB) waitRows(t *testing.T, want int64, where string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := db.count(t, where)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows WHERE %s, want %d", n, where, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newKey() string { return uuid.NewString() }

func jsonResp(status int, body string) idempotency.Response {
	return idempotency.Response{
		Status: status, Body: []byte(body), BodyKind: idempotency.BodyJSON,
		Header: http.Header{"Content-Type": {"application/json"}},
	}
}

func rawResp() idempotency.Response {
	return idempotency.Response{Status: 200, Body: []byte("hello"), BodyKind: idempotency.BodyRaw}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"},
		{"help", "cleanup"},
		{"migrate", "--help"}, {"cleanup", "--help"}, {"erase", "--help"}, {"export", "--help"},
		{"inspect", "--help"}, {"stats", "-h"}, {"release", "--help"}, {"version", "--help"},
		{"list", "--help"}, {"reseal", "--help"}, {"help", "list"},
	} {
		r := runCLI(t, nil, args...)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "Usage: idempotency") || !strings.Contains(r.stdout, "Example") {
			t.Errorf("%q: help lacks usage or example:\n%s", args, r.stdout)
		}
		if len(args) == 2 && args[1] == "--help" && !strings.Contains(r.stdout, "--database-url URL") {
			t.Errorf("%q: help lacks the global flags:\n%s", args, r.stdout)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	// None of these needs a database: usage is checked before connecting,
	// and the URL points nowhere.
	env := map[string]string{envDatabaseURL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus", "stats"}, "flag provided but not defined: -bogus"},
		{[]string{"stats", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"stats", "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "--timeout", "soon"}, "want a Go duration"},
		{[]string{"stats", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"migrate"}, "missing action"},
		{[]string{"migrate", "sideways"}, `unknown action "sideways"`},
		{[]string{"migrate", "down"}, "pass --yes to confirm"},
		{[]string{"cleanup", "--batch", "0"}, "--batch must be between 1 and 100000"},
		{[]string{"cleanup", "--batch", "many"}, "invalid value"},
		{[]string{"erase"}, "--user ID or --unscoped is required"},
		{[]string{"export"}, "--user ID or --unscoped is required"},
		{[]string{"erase", "--user", ""}, "--user is empty"},
		{[]string{"export", "--user="}, "--user is empty"},
		{[]string{"erase", "--user", "42", "--unscoped"}, "--user and --unscoped exclude each other"},
		{[]string{"export", "--unscoped", "--user", ""}, "--user and --unscoped exclude each other"},
		{[]string{"erase", "--user", "bad\xff"}, "malformed --user"},
		{[]string{"inspect"}, "--key is required"},
		{[]string{"inspect", "--key", "k", "--user", "1", "--unscoped"}, "--user and --unscoped exclude each other"},
		{[]string{"inspect", "--key", "k", "--user", ""}, "--user is empty"},
		{[]string{"release", "--key", "k", "--yes"}, "--user ID or --unscoped is required"},
		{[]string{"release", "--key", "k", "--user", "", "--yes"}, "--user is empty"},
		{[]string{"reseal", "--user", "1", "--unscoped"}, "--user and --unscoped exclude each other"},
		{[]string{"list"}, "give one of --stale, --failed or --counts"},
		{[]string{"list", "--stale", "--failed"}, "give one of --stale, --failed or --counts"},
		{[]string{"list", "--counts", "--limit", "0"}, "--limit must be from 1 to 1000000"},
		{[]string{"list", "--stale", "--user", "1", "--unscoped"}, "--user and --unscoped exclude each other"},
		{[]string{"inspect", "--key", "caf\u00e9"}, "malformed --key \"caf\u00e9\""},
		{[]string{"inspect", "--key", ""}, "malformed --key"},
		{[]string{"inspect", "--key", strings.Repeat("k", 256)}, "malformed --key"},
		{[]string{"inspect", "--key", "a\tb"}, "malformed --key"},
		{[]string{"inspect", "--key", `"0b3e1a5c-7a1f-4c1e-9f3d-2f6a8c9b1d20`}, "malformed --key"},
		{[]string{"inspect", "--key", `"abc";a=b`}, "malformed --key"},
		{[]string{"stats", "--database-url", "postgres://h:notaport/db"}, "invalid database URL"},
	} {
		r := runCLI(t, env, tc.args...)
		if r.code != exitUsage {
			t.Errorf("%q: exit status %d, want 2 (stderr %q)", tc.args, r.code, r.stderr)
			continue
		}
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: stderr %q, want it to contain %q", tc.args, r.stderr, tc.want)
		}
		if lines := strings.Count(strings.TrimRight(r.stderr, "\n"), "\n"); lines != 0 {
			t.Errorf("%q: error is %d lines, want one: %q", tc.args, lines+1, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("%q: stdout %q, want nothing", tc.args, r.stdout)
		}
	}
}

func TestNoDatabaseURL(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "stats")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "set --database-url or DATABASE_URL") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestBadURLHidesPassword(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "stats", "--database-url", "postgres://u:s3cret@h:notaport/db")
	wantCode(t, r, exitUsage)
	if strings.Contains(r.stderr, "s3cret") {
		t.Errorf("the error shows the password: %q", r.stderr)
	}
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := runCLI(t, nil, "stats", "--database-url", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "cannot reach the database") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr %q, want one line saying the database cannot be reached", r.stderr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to report a refused connection", d)
	}
}

// TestSilentDatabase checks that a server that accepts connections but
// never answers fails within the connect timeout instead of hanging.
func TestSilentDatabase(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	defer func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	}()

	start := time.Now()
	r := runCLI(t, nil, "stats", "--database-url", "postgres://postgres@"+ln.Addr().String()+"/postgres?sslmode=disable")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "cannot reach the database") {
		t.Errorf("stderr %q", r.stderr)
	}
	// The connect timeout is 5s per address; allow five times that.
	if d := time.Since(start); d > 5*2*connectTimeout {
		t.Errorf("took %v, want about %v", d, connectTimeout)
	}
}

func TestDatabaseURLFromEnvironment(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)

	r := runCLI(t, map[string]string{envDatabaseURL: db.dsn}, "stats")
	wantCode(t, r, exitOK)

	// The flag wins over the variable.
	r = runCLI(t, map[string]string{envDatabaseURL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable"},
		"--database-url", db.dsn, "stats")
	wantCode(t, r, exitOK)
}

func TestMissingTable(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	wantCode(t, runDB(t, db.dsn, "migrate", "down", "--yes"), exitOK)
	key := newKey()
	for _, args := range [][]string{
		{"stats"}, {"cleanup"}, {"cleanup", "--dry-run"}, {"erase", "--user", "1"}, {"export", "--user", "1"},
		{"inspect", "--key", key},
	} {
		r := runDB(t, db.dsn, args...)
		wantCode(t, r, exitFailure)
		if !strings.Contains(r.stderr, "run `idempotency migrate up`") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%q: stderr %q, want one line saying to run migrate up", args, r.stderr)
		}
	}
}

func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	r := runDB(t, db.dsn, "stats", "--timeout", "1ns")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "timed out after 1ns (raise --timeout)") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestOutdatedSchema: a table made by an older 000001 (here: no
// owner_token) is refused up front with the name of what it lacks, before
// any command reads or changes keys.
func TestOutdatedSchema(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)
	if _, err := db.pool.Exec(t.Context(), `ALTER TABLE idempotency_keys DROP COLUMN owner_token`); err != nil {
		t.Fatal(err)
	}
	r := runDB(t, db.dsn, "stats")
	wantCode(t, r, exitFailure)
	if !strings.Contains(r.stderr, "lacks column owner_token") {
		t.Errorf("stderr %q, want the missing column named", r.stderr)
	}
}
