package testdb

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// never bounds the detection in these tests: several times the timeouts it
// is given, so it only catches a hang.
const never = 5 * pingTimeout

// unixServer serves h on a Unix socket in a temporary directory and returns
// its DOCKER_HOST address.
func unixServer(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(h)
	_ = ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	return "unix://" + sock
}

// ping answers /_ping like a Docker engine, with status.
func ping(status int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_ping" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("OK"))
	})
}

// detect runs dockerHost with timeout, failing the test if it hangs.
func detect(t *testing.T, timeout time.Duration) (string, error) {
	t.Helper()
	type result struct {
		host string
		err  error
	}
	c := make(chan result, 1)
	go func() {
		h, err := dockerHost(timeout)
		c <- result{h, err}
	}()
	select {
	case r := <-c:
		return r.host, r.err
	case <-time.After(never):
		t.Fatal("Docker detection hung")
		return "", nil
	}
}

func TestNoEngineWhenTheSocketIsAbsent(t *testing.T) {
	absent := "unix://" + filepath.Join(t.TempDir(), "docker.sock")
	t.Setenv("DOCKER_HOST", absent)
	if _, err := detect(t, pingTimeout); err == nil || !strings.Contains(err.Error(), absent+": no socket") {
		t.Fatalf("DOCKER_HOST=%s: err %v, want no Docker engine (no socket)", absent, err)
	}

	// The default places: none of them holds a socket here.
	if _, err := os.Stat("/var/run/docker.sock"); err == nil {
		t.Skip("this machine has /var/run/docker.sock")
	}
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	_, err := detect(t, pingTimeout)
	if err == nil || strings.Count(err.Error(), ": no socket") != 3 || !strings.HasPrefix(err.Error(), "no Docker engine answered") {
		t.Fatalf("default places: err %v, want no Docker engine at any of the three sockets", err)
	}
}

func TestEngineDetection(t *testing.T) {
	// A stale socket file nobody listens on.
	stale := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()

	// An engine that accepts connections but never answers.
	mute := filepath.Join(t.TempDir(), "docker.sock")
	ml, err := net.Listen("unix", mute)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ml.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	t.Cleanup(func() {
		_ = ml.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})

	tcp := httptest.NewServer(ping(http.StatusOK))
	t.Cleanup(tcp.Close)

	for _, c := range []struct {
		name, host string
		ok         bool
		why        string
	}{
		{"unix engine", unixServer(t, ping(http.StatusOK)), true, ""},
		{"tcp engine", "tcp://" + tcp.Listener.Addr().String(), true, ""},
		{"unhealthy engine", unixServer(t, ping(http.StatusInternalServerError)), false, "500"},
		{"not an engine", unixServer(t, http.NotFoundHandler()), false, "404"},
		{"stale socket", "unix://" + stale, false, "refused"},
		{"mute engine", "unix://" + mute, false, "deadline exceeded"},
		{"unknown scheme", "npipe:////./pipe/docker_engine", false, "not supported"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("DOCKER_HOST", c.host)
			host, err := detect(t, 200*time.Millisecond)
			if c.ok && (err != nil || host != c.host) {
				t.Fatalf("got %q, %v; want %q", host, err, c.host)
			}
			if !c.ok && (err == nil || !strings.Contains(err.Error(), c.why)) {
				t.Fatalf("got %q, %v; want an error saying %q", host, err, c.why)
			}
		})
	}
}

// TestNoDatabaseSkipsOrFails runs this test binary again without a database
// URL and with no Docker engine: a Postgres test skips with one line, and
// notes it in the skip log make test reads, or fails with
// IDEMPOTENCY_REQUIRE_DB=1.
func TestNoDatabaseSkipsOrFails(t *testing.T) {
	if os.Getenv("TESTDB_CHILD") != "" {
		t.Skip("in the child")
	}
	sock := "unix://" + filepath.Join(t.TempDir(), "docker.sock")
	skips := filepath.Join(t.TempDir(), "skips")
	for _, require := range []string{"", "1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNewDSN$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), EnvURL+"=", EnvRequire+"="+require, "DOCKER_HOST="+sock, "TESTDB_CHILD=1", EnvSkipLog+"="+skips)
		out, err := cmd.CombinedOutput()
		msg := "testdb: no PostgreSQL: set " + EnvURL
		if require == "" && (err != nil || !strings.Contains(string(out), "--- SKIP: TestNewDSN") || !strings.Contains(string(out), msg)) {
			t.Errorf("without %s: err %v, output:\n%s\nwant a skip saying %q", EnvRequire, err, out, msg)
		}
		if require == "1" && (err == nil || !strings.Contains(string(out), "--- FAIL: TestNewDSN") || !strings.Contains(string(out), msg)) {
			t.Errorf("with %s=1: err %v, output:\n%s\nwant a failure saying %q", EnvRequire, err, out, msg)
		}
		if !strings.Contains(string(out), "no Docker engine answered ("+sock+": no socket)") {
			t.Errorf("output:\n%s\nwant the reason: no Docker engine at %s", out, sock)
		}
	}
	// One line, from the skip alone: a failure is loud already.
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(skips)
	if want := dir + "\tno PostgreSQL: set " + EnvURL + " or start Docker\n"; err != nil || string(got) != want {
		t.Errorf("skip log: %q, %v; want %q", got, err, want)
	}
}
