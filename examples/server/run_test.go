package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
)

// startServe runs serve(ctx, cfg) with its logs in a logWatcher and returns
// the watcher, a client of the bound address, and serve's result.
func startServe(t *testing.T, ctx context.Context, cfg config) (*logWatcher, *client, <-chan error) {
	t.Helper()
	logs := newLogWatcher()
	cfg.logger = slogJSON(logs)
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, cfg) }()
	listening := logs.waitFor(t, "listening")
	return logs, newClient(t, "http://"+fmt.Sprint(listening["addr"])), errc
}

func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(waitLimit):
		t.Fatal("serve did not return")
		return nil
	}
}

// TestRun drives run itself: flags, JSON logs on stderr, a served order and
// a clean stop when the context ends.
func TestRun(t *testing.T) {
	t.Parallel()
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout bytes.Buffer
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-addr", "127.0.0.1:0", "-lease", "5s"}, getenvOf(map[string]string{"ORDER_LATENCY": "1ms"}), &stdout, logs)
	}()
	listening := logs.waitFor(t, "listening")
	if listening["store"] != "memory" || listening["lease"] != "5s" || listening["order_latency"] != "1ms" {
		t.Fatalf("listening line %v", listening)
	}
	logs.waitFor(t, "SESSION_SECRET is unset: session tokens are signed with a public development secret; set it outside development")
	c := newClient(t, "http://"+fmt.Sprint(listening["addr"]))
	_, tok := c.newUser(t)
	key := uuid.NewString()
	expect(t, c.order(t, tok, key, aapl(2)), http.StatusCreated, "")
	if r := c.order(t, tok, key, aapl(2)); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %s", r)
	}
	cancel()
	if err := waitErr(t, errc); err != nil {
		t.Fatalf("run: %v", err)
	}
	logs.waitFor(t, "stopped")
	if strings.Contains(logs.String(), key) {
		t.Fatal("the logs contain an idempotency key")
	}
}

// TestShutdownDrains stops the server while an order is in its handler:
// the listener closes at once, the order still completes.
func TestShutdownDrains(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-lease", "20s"}, getenvOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	cfg.beforeFill = func(ctx context.Context, o order) {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, c, errc := startServe(t, ctx, cfg)
	_, tok := c.newUser(t)
	key := uuid.NewString()
	done := make(chan response, 1)
	go func() {
		r, err := c.try(req{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: aapl(1)})
		if err != nil {
			r = response{Raw: []byte(err.Error())}
		}
		done <- r
	}()
	<-started
	cancel()
	logs.waitFor(t, "shutting down: draining in-flight requests")
	addr := strings.TrimPrefix(c.base, "http://")
	// Shutdown closes the listener right after that line; wait for it.
	deadline := time.Now().Add(waitLimit)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections while shutting down")
		}
		time.Sleep(10 * time.Millisecond) // polling for the listener to close
	}
	close(release)
	if r := <-done; r.Status != http.StatusCreated {
		t.Fatalf("the in-flight order: %s", r)
	}
	if err := waitErr(t, errc); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestShutdownDrainLimit: a request that outlives the lease is cut off and
// the server still exits cleanly.
func TestShutdownDrainLimit(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-lease", "1s", "-store-timeout", "500ms"}, getenvOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	cfg.beforeFill = func(context.Context, order) {
		once.Do(func() { close(started) })
		<-release // an unkeyed order has no deadline: it would run forever
	}
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, c, errc := startServe(t, ctx, cfg)
	_, tok := c.newUser(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.try(req{method: "POST", path: "/api/trading/orders", token: tok, body: aapl(1)})
		done <- err
	}()
	<-started
	start := time.Now()
	cancel()
	if err := waitErr(t, errc); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v with a 1s lease", d)
	}
	logs.waitFor(t, "drain limit reached; closing the remaining connections")
	if err := <-done; err == nil {
		t.Fatal("the cut-off request got an answer")
	}
}

// TestStartupDatabaseUnreachable: without a database, start-up retries for
// its wait, then fails with a clear message and exit status 1.
func TestStartupDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	proxy := tcpproxy.New(t, "127.0.0.1:1") // refuses every connection once cut
	proxy.Cut()
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-database-url",
		"postgres://postgres:secret@" + proxy.Addr() + "/postgres?sslmode=disable"}, getenvOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	cfg.dbWait = 1500 * time.Millisecond
	logs := newLogWatcher()
	cfg.logger = slogJSON(logs)
	start := time.Now()
	err = serve(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "database unreachable") || !strings.Contains(err.Error(), "gave up after 1.5s") {
		t.Fatalf("serve: %v", err)
	}
	if d := time.Since(start); d > 5*cfg.dbWait+10*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	logs.waitFor(t, "database not reachable yet; retrying")
	var stderr bytes.Buffer
	if code := exitCode(err, &stderr); code != 1 || strings.Contains(stderr.String(), "secret") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestProcess builds the server and runs it as a real process in memory
// mode: an order, its replay, then SIGTERM and exit status 0.
func TestProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a binary")
	}
	t.Parallel()
	// go test puts its own GOROOT/bin first in PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		testdb.Skip(t, "no go command", "no go command to build the server with")
	}
	bin := filepath.Join(t.TempDir(), "server")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("bad flag exits 2", func(t *testing.T) {
		cmd := exec.Command(bin, "-lease", "forever")
		cmd.Env = serverEnv()
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "-lease") {
			t.Fatalf("exit %v: %s", err, out)
		}
	})

	t.Run("serves, then stops on SIGTERM", func(t *testing.T) {
		cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
		cmd.Env = append(serverEnv(), "SESSION_SECRET=process-test-secret", "IDEMPOTENCY_LEASE=10s")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logs := newLogWatcher()
		scanned := make(chan struct{})
		go func() {
			scanLines(stderr, logs)
			close(scanned)
		}()
		exited := false
		t.Cleanup(func() {
			if !exited {
				_ = cmd.Process.Kill() // our own child, by its pid
				<-scanned
				_ = cmd.Wait()
			}
		})

		listening := logs.waitFor(t, "listening")
		if listening["store"] != "memory" || listening["lease"] != "10s" {
			t.Fatalf("listening line %v", listening)
		}
		c := newClient(t, "http://"+fmt.Sprint(listening["addr"]))
		_, tok := c.newUser(t)
		key := uuid.NewString()
		first := c.order(t, tok, key, aapl(7))
		expect(t, first, http.StatusCreated, "")
		replay := c.order(t, tok, key, aapl(7))
		expect(t, replay, http.StatusCreated, "")
		if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Body["id"] != first.Body["id"] {
			t.Fatalf("replay %s of %s", replay, first)
		}

		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-scanned:
		case <-time.After(waitLimit):
			t.Fatal("the server did not exit after SIGTERM")
		}
		err = cmd.Wait()
		exited = true
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
		logs.waitFor(t, "stopped")
		if strings.Contains(logs.String(), "SESSION_SECRET is unset") {
			t.Fatal("warned about SESSION_SECRET although it was set")
		}
	})
}

// serverEnv is the test's environment without anything the server reads.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case envAddr, envDatabaseURL, envOrderLatency, envLease, envStoreTimeout, envSessionSecret,
			envNewOrdersDisable, envSealKeys, "FLAG_IDEMPOTENCY_MIDDLEWARE":
			continue
		}
		env = append(env, kv)
	}
	return env
}
