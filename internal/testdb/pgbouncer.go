package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/migrations"
)

// EnvRequirePgBouncer set to 1 turns "no pgbouncer binary" from a skip into
// a failure (CI sets it).
const EnvRequirePgBouncer = "IDEMPOTENCY_REQUIRE_PGBOUNCER"

// PgBouncer's settings for the tests. Transaction pooling is the mode
// whose pitfalls the tests are for; a small server pool per database makes
// client connections share server connections, as in production.
const (
	pgbouncerPoolSize = 2
	pgbouncerStart    = 10 * time.Second // bound on PgBouncer starting to listen
)

// bouncer is the PgBouncer started for this test binary, if any.
var bouncer struct {
	once sync.Once
	err  error  // why there is none
	skip bool   // err means "not installed", not "broken"
	addr string // host:port it listens on
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	dir  string
}

// RequirePgBouncer starts, once per test binary, a PgBouncer in transaction
// mode on a loopback port in front of the test server, and skips the test
// with one line when the pgbouncer binary is not installed (or fails it
// when IDEMPOTENCY_REQUIRE_PGBOUNCER=1). PgBouncer refuses to run as root:
// under root it runs as the postgres user. Call it at the top of a test
// before its subtests, so that a missing PgBouncer skips once.
func RequirePgBouncer(tb testing.TB) {
	tb.Helper()
	base := serverURL(tb)
	bouncer.once.Do(func() { startPgBouncer(base) })
	if bouncer.err == nil {
		return
	}
	if bouncer.skip && os.Getenv(EnvRequirePgBouncer) != "1" {
		Skip(tb, "no PgBouncer: install pgbouncer", fmt.Sprintf("testdb: %v; the PgBouncer tests are skipped (set %s=1 to fail instead)", bouncer.err, EnvRequirePgBouncer))
	}
	tb.Fatalf("testdb: %v", bouncer.err)
}

// NewPgBouncer returns a pool that reaches a new database, migrated
// directly (never through the pooler), through the test binary's PgBouncer
// in transaction mode. A database of its own rather than a schema: a
// search_path set on one client's connection would leak to the others that
// share its server connection, and PgBouncer 1.18 refuses search_path and
// options as startup parameters. The pool uses default_query_exec_mode=exec,
// which transaction pooling needs; a test can set another mode with
// Configure. The database is dropped when the test ends.
func NewPgBouncer(tb testing.TB, opts ...Option) *pgxpool.Pool {
	tb.Helper()
	pooled, direct := newPooledDB(tb, "exec")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	// Migrations take a session advisory lock: they run on a direct
	// connection, as docs/scaling.md tells users to.
	mcfg, err := pgxpool.ParseConfig(direct)
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	mcfg.MaxConns = 2
	mpool, err := pgxpool.NewWithConfig(ctx, mcfg)
	if err != nil {
		tb.Fatalf("testdb: open pool: %v", err)
	}
	err = migrations.Migrate(ctx, mpool)
	mpool.Close()
	if err != nil {
		tb.Fatalf("testdb: migrate database: %v", err)
	}

	cfg, err := pgxpool.ParseConfig(pooled)
	if err != nil {
		tb.Fatalf("testdb: parse PgBouncer URL: %v", err)
	}
	cfg.MaxConns = DefaultMaxConns
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("testdb: open pool through PgBouncer: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NewPgBouncerDSN returns two URLs of a new, empty database (no tables),
// dropped when the test ends: pooled reaches it through the test binary's
// PgBouncer in transaction mode, with default_query_exec_mode=cache_describe
// (exec, as NewPgBouncer uses, also works for the store but makes pgx refuse
// a map as a JSON argument and send []byte as bytea); direct reaches the
// server itself, for migrations.
func NewPgBouncerDSN(tb testing.TB) (pooled, direct string) {
	tb.Helper()
	return newPooledDB(tb, "cache_describe")
}

// newPooledDB creates a database and returns its URLs through PgBouncer, with
// the query exec mode mode, and direct.
func newPooledDB(tb testing.TB, mode string) (pooled, direct string) {
	tb.Helper()
	RequirePgBouncer(tb)
	base := serverURL(tb)
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	if err := adminExec(base, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testdb: create database: %v", err)
	}
	tb.Cleanup(func() {
		// FORCE ends PgBouncer's server connections to it.
		if err := adminExec(base, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("testdb: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	u.Path = "/" + name
	direct = u.String()
	u.Host = bouncer.addr
	q := u.Query()
	q.Set("sslmode", "disable") // PgBouncer here has no TLS
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String(), direct
}

// startPgBouncer starts PgBouncer in front of the server at base, setting
// the bouncer variable.
func startPgBouncer(base string) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/pgbouncer") // Debian's, off a user's PATH
	}
	if err != nil {
		bouncer.err, bouncer.skip = errors.New("no pgbouncer on PATH (Debian: apt-get install pgbouncer)"), true
		return
	}
	cfg, err := pgconn.ParseConfig(base)
	if err != nil {
		bouncer.err = fmt.Errorf("parse %s: %w", EnvURL, err)
		return
	}
	if strings.HasPrefix(cfg.Host, "/") {
		bouncer.err = fmt.Errorf("PgBouncer needs a TCP server, not the socket %s", cfg.Host)
		return
	}
	// The last error wins: a port taken between choosing and binding it
	// makes PgBouncer exit, and another port is tried.
	for range 3 {
		if bouncer.err = tryPgBouncer(bin, cfg); bouncer.err == nil {
			return
		}
	}
}

// tryPgBouncer starts PgBouncer once on a free loopback port.
func tryPgBouncer(bin string, server *pgconn.Config) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		return err
	}
	cred, err := runAs()
	if err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 2000
server_idle_timeout = 10
server_connect_timeout = 5
logfile = %s
`, server.Host, server.Port, port, filepath.Join(dir, "users.txt"), pgbouncerPoolSize, filepath.Join(dir, "pgbouncer.log"))
	users := fmt.Sprintf("%q %q\n", server.User, server.Password)
	if err := writeFiles(dir, cred, map[string]string{"pgbouncer.ini": ini, "users.txt": users}); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	setProcAttr(cmd, cred)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	bouncer.addr, bouncer.cmd, bouncer.done, bouncer.dir = net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd, done, dir

	deadline := time.Now().Add(pgbouncerStart)
	for {
		c, err := net.DialTimeout("tcp", bouncer.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			stopPgBouncer()
			return fmt.Errorf("pgbouncer exited at start-up: %s", lastLines(string(log), 5))
		case <-time.After(50 * time.Millisecond): // polling a port, not synchronising
		}
		if time.Now().After(deadline) {
			stopPgBouncer()
			return fmt.Errorf("pgbouncer did not listen on %s within %v", bouncer.addr, pgbouncerStart)
		}
	}
}

// stopPgBouncer stops the PgBouncer started, by its pid, and removes its
// directory.
func stopPgBouncer() {
	if bouncer.cmd == nil {
		return
	}
	_ = bouncer.cmd.Process.Kill()
	<-bouncer.done
	_ = os.RemoveAll(bouncer.dir)
	bouncer.cmd = nil
}

// runAs returns the user PgBouncer runs as: nil (this process's) unless
// this process is root, which PgBouncer refuses; then postgres.
func runAs() (*user.User, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PgBouncer refuses to run as root and there is no postgres user: %w", err)
	}
	return u, nil
}

// writeFiles writes files into dir, both owned by u when it is not nil.
func writeFiles(dir string, u *user.User, files map[string]string) error {
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	if u == nil {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
