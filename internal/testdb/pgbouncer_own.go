package testdb

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PgBouncerTo starts a PgBouncer of the test's own, in transaction mode,
// in front of the PostgreSQL server at host:port (a tcpproxy, for outage
// tests), and returns the address it listens on. A client waits at most a
// second for a server connection (query_wait_timeout), then gets
// PgBouncer's own error. PgBouncer is stopped, by its pid, when the test
// ends. It skips or fails as RequirePgBouncer does.
func PgBouncerTo(tb testing.TB, host string, port uint16) string {
	tb.Helper()
	RequirePgBouncer(tb)
	server, err := pgconn.ParseConfig(serverURL(tb))
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	listen, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-own-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	cred, err := runAs()
	if err != nil {
		tb.Fatal(err)
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
server_connect_timeout = 1
server_login_retry = 1
query_wait_timeout = 1
logfile = %s
`, host, port, listen, filepath.Join(dir, "users.txt"), pgbouncerPoolSize, filepath.Join(dir, "pgbouncer.log"))
	users := fmt.Sprintf("%q %q\n", server.User, server.Password)
	if err := writeFiles(dir, cred, map[string]string{"pgbouncer.ini": ini, "users.txt": users}); err != nil {
		tb.Fatal(err)
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	setProcAttr(cmd, cred)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testdb: start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	deadline := time.Now().Add(pgbouncerStart)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return addr
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("testdb: pgbouncer exited at start-up: %s", lastLines(string(log), 5))
		case <-time.After(50 * time.Millisecond): // polling a port, not synchronising
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testdb: pgbouncer did not listen on %s within %v", addr, pgbouncerStart)
		}
	}
}
