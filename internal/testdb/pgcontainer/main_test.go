package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// never bounds waiting for run in these tests: they never hang, however
// slow the machine.
const never = time.Minute

// fakeStart is a startFunc that starts nothing and counts stops.
type fakeStart struct {
	opts  options
	stops atomic.Int32
	err   error
}

func (f *fakeStart) start(_ context.Context, o options) (string, func(context.Context) error, error) {
	f.opts = o
	if f.err != nil {
		return "", nil, f.err
	}
	return "postgres://postgres:postgres@127.0.0.1:32768/idempotency_test?sslmode=disable",
		func(context.Context) error { f.stops.Add(1); return nil }, nil
}

// startRun runs run in a goroutine with a pipe as stdin; it returns the
// stdin writer, stdout's reader and the exit status's channel.
func startRun(ctx context.Context, args []string, f *fakeStart, stderr io.Writer) (*io.PipeWriter, *bufio.Reader, <-chan int) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, args, inR, outW, stderr, f.start)
		_ = outW.Close()
	}()
	return inW, bufio.NewReader(outR), code
}

func waitCode(t *testing.T, code <-chan int) int {
	t.Helper()
	select {
	case c := <-code:
		return c
	case <-time.After(never):
		t.Fatal("run did not return")
		return -1
	}
}

func TestPrintsDSNAndStopsWhenStdinCloses(t *testing.T) {
	f := &fakeStart{}
	var stderr bytes.Buffer
	stdin, stdout, code := startRun(t.Context(), []string{"-image", "postgres:17-alpine"}, f, &stderr)
	line, err := stdout.ReadString('\n')
	if err != nil || line != "postgres://postgres:postgres@127.0.0.1:32768/idempotency_test?sslmode=disable\n" {
		t.Fatalf("first line %q (err %v), want the DSN and a newline", line, err)
	}
	if f.opts.image != "postgres:17-alpine" || f.opts.timeout != 2*time.Minute {
		t.Fatalf("options %+v, want the -image given and the default timeout", f.opts)
	}
	if n := f.stops.Load(); n != 0 {
		t.Fatalf("stopped %d times while stdin is open, want 0", n)
	}
	_ = stdin.Close()
	if c := waitCode(t, code); c != 0 || f.stops.Load() != 1 {
		t.Fatalf("exit %d, %d stops (stderr %q); want 0 and 1", c, f.stops.Load(), stderr.String())
	}
	if rest, _ := io.ReadAll(stdout); len(rest) != 0 {
		t.Fatalf("stdout after the DSN: %q, want nothing", rest)
	}
}

func TestStopsOnSignal(t *testing.T) {
	f := &fakeStart{}
	ctx, cancel := context.WithCancel(t.Context()) // what SIGTERM does in main
	stdin, stdout, code := startRun(ctx, nil, f, io.Discard)
	defer stdin.Close()
	if _, err := stdout.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	if c := waitCode(t, code); c != 0 || f.stops.Load() != 1 {
		t.Fatalf("exit %d, %d stops; want 0 and 1", c, f.stops.Load())
	}
}

func TestStartFailure(t *testing.T) {
	f := &fakeStart{err: errors.New("pull access denied")}
	var stderr bytes.Buffer
	stdin, stdout, code := startRun(t.Context(), nil, f, &stderr)
	defer stdin.Close()
	out, _ := io.ReadAll(stdout)
	if c := waitCode(t, code); c != 1 || len(out) != 0 || !strings.Contains(stderr.String(), "pull access denied") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 1, nothing, and the cause", c, out, stderr.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-timeout", "0"}, {"-image", ""}, {"-nope"}, {"extra"}} {
		f := &fakeStart{}
		var stderr bytes.Buffer
		if c := run(t.Context(), args, strings.NewReader(""), io.Discard, &stderr, f.start); c != 2 || stderr.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, c, stderr.String())
		}
		if f.opts.image != "" {
			t.Errorf("%q: started a container", args)
		}
	}
}
