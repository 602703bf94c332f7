package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunAgainstServer runs the example server (in memory) as a process
// and the client against it: with half of the order requests faulted, it
// places every order once (run's own check against the server's list) and
// some of them were replays.
func TestRunAgainstServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server")
	}
	base := startServer(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := run(ctx, []string{"-server", base, "-orders", "8", "-faults", "0.5", "-seed", "7",
		"-delay", "2s", "-attempt-timeout", "1s"}, &out)
	t.Logf("client output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !strings.Contains(out.String(), "8 orders placed, 8 on the server: each placed exactly once") {
		t.Fatal("no success line")
	}
	if n := strings.Count(out.String(), "(a replay)"); n == 0 {
		t.Fatal("no order was a replay: the proxy faulted nothing after the server answered")
	}
}

// TestVerify: the final check catches an order listed twice, one the
// client never got, and one missing.
func TestVerify(t *testing.T) {
	t.Parallel()
	placed := map[int64]string{1: "k1", 2: "k2"}
	for _, tc := range []struct {
		name   string
		listed []order
		ok     bool
	}{
		{"each once", []order{{ID: 1, ClientOrderID: "k1"}, {ID: 2, ClientOrderID: "k2"}}, true},
		{"listed twice", []order{{ID: 1, ClientOrderID: "k1"}, {ID: 1, ClientOrderID: "k1"}, {ID: 2, ClientOrderID: "k2"}}, false},
		{"a second order for one key", []order{{ID: 1, ClientOrderID: "k1"}, {ID: 2, ClientOrderID: "k2"}, {ID: 3, ClientOrderID: "k2"}}, false},
		{"missing", []order{{ID: 1, ClientOrderID: "k1"}}, false},
		{"wrong key", []order{{ID: 1, ClientOrderID: "k1"}, {ID: 2, ClientOrderID: "k1"}}, false},
	} {
		if err := verify(placed, tc.listed); (err == nil) != tc.ok {
			t.Errorf("%s: verify = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-faults") {
		t.Errorf("-h: %v, %q", err, out.String())
	}
	for _, args := range [][]string{{"-orders", "0"}, {"-faults", "2"}, {"extra"}, {"-server", "::"}} {
		if err := run(context.Background(), args, &out); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// startServer builds and starts the example server in memory on a free
// port and returns its base URL; the process is killed when the test ends.
func startServer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		testdb.Skip(t, "no go command", "no go command to build the server with")
	}
	bin := filepath.Join(t.TempDir(), "server")
	if out, err := exec.Command(goBin, "build", "-o", bin, "../server").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "ADDR=", "ORDER_LATENCY=", "MBT_NEW_ORDERS_DISABLED=", "FLAG_IDEMPOTENCY_MIDDLEWARE=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "listening" {
				addr <- line["addr"].(string)
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // our own child, by its pid
		<-scanned
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		if !regexp.MustCompile(`^127\.0\.0\.1:\d+$`).MatchString(a) {
			t.Fatalf("listening on %q", a)
		}
		return "http://" + a
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not start within 60s")
		return ""
	}
}
