// Package childproc starts the test binary again as a server process, for
// tests that need two servers or a kill -9 of one: the child announces its
// address with one stdout line "ADDR <address>" and serves until its stdin
// closes. The contrib modules' RPC tests share it.
package childproc

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Child is a server process started by Start.
type Child struct {
	Cmd   *exec.Cmd
	Addr  string      // what the child announced after "ADDR "
	lines chan string // the child's further stdout lines
}

// Start runs the test binary with no test selected and env added to the
// environment (the child's TestMain serves when it finds its variables),
// and waits up to 30 s for its address. The child is killed at the end of
// the test.
func Start(t *testing.T, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{Cmd: cmd, lines: make(chan string, 16)}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	line := c.Next(t, 30*time.Second)
	addr, ok := strings.CutPrefix(line, "ADDR ")
	if !ok {
		t.Fatalf("child server: %q", line)
	}
	c.Addr = addr
	return c
}

// Next is the child's next stdout line, within limit; the test fails when
// the child exits or says nothing for that long.
func (c *Child) Next(t *testing.T, limit time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			t.Fatal("the child server exited")
		}
		return line
	case <-time.After(limit):
		t.Fatalf("no line from the child server in %v", limit)
	}
	return ""
}
