package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// event is one line the consumer logged (JSON on stderr), with the process
// that logged it.
type event struct {
	Proc       string `json:"-"`
	Level      string `json:"level"`
	Msg        string `json:"msg"`
	Key        string `json:"key"`
	Verdict    string `json:"verdict"`
	Answer     string `json:"answer"`
	Deliveries uint64 `json:"deliveries"`
	Point      string `json:"point"`
	Kind       string `json:"kind"`
	Error      string `json:"error"`
}

func (ev event) String() string {
	return fmt.Sprintf("%s: %s %s key=%q verdict=%s answer=%s deliveries=%d point=%s kind=%s error=%q",
		ev.Proc, ev.Level, ev.Msg, ev.Key, ev.Verdict, ev.Answer, ev.Deliveries, ev.Point, ev.Kind, ev.Error)
}

// fleet runs one test's consumer processes; their events arrive on one
// channel, in the order their lines were read.
type fleet struct {
	t       *testing.T
	events  chan event
	backlog []event // read from events, not yet returned (the test's goroutine only)

	mu    sync.Mutex
	procs []*proc
	lines []string // every process's output, for a failing test
}

// proc is one consumer process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{} // closed once it has exited and its output is read
	err    error         // cmd.Wait's, once exited
	ending atomic.Bool   // the test killed or stopped it: its exit is no failure
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{t: t, events: make(chan event, 1<<16)}
	t.Cleanup(func() {
		for _, p := range f.procs {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, l := range f.lines {
			if strings.Contains(l, "WARNING: DATA RACE") {
				t.Error("a consumer process reported a data race")
			}
		}
		if t.Failed() {
			t.Logf("consumer output:\n%s", strings.Join(f.lines, "\n"))
		}
	})
	return f
}

// start runs the consumer binary with flags and extra environment
// variables (the hooks).
func (f *fleet) start(name string, flags []string, environ ...string) *proc {
	f.t.Helper()
	cmd := exec.Command(bin.consumer, flags...)
	cmd.Env = append(os.Environ(), environ...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			f.mu.Lock()
			f.lines = append(f.lines, name+": "+line)
			f.mu.Unlock()
			ev := event{Proc: name}
			if json.Unmarshal([]byte(line), &ev) == nil {
				f.events <- ev
			}
		}
		p.err = cmd.Wait()
		f.events <- event{Proc: name, Msg: "exited"}
		close(p.exited)
	}()
	f.await(time.Minute, func(ev event) bool { return ev.Proc == name && ev.Msg == "consuming" })
	return p
}

// await returns the first event, oldest first, that satisfies match,
// keeping every other one for the next await or next. It fails the test
// if none comes within timeout, or if a process stops on its own
// meanwhile.
func (f *fleet) await(timeout time.Duration, match func(event) bool) event {
	f.t.Helper()
	deadline := time.After(timeout)
	for i := 0; ; i++ {
		if i == len(f.backlog) {
			select {
			case ev := <-f.events:
				f.backlog = append(f.backlog, ev)
			case <-deadline:
				f.t.Fatalf("no awaited event within %v", timeout)
			}
		}
		ev := f.backlog[i]
		if match(ev) {
			f.backlog = append(f.backlog[:i], f.backlog[i+1:]...)
			return ev
		}
		if (ev.Msg == "exited" || ev.Msg == "consumer stopped") && !f.proc(ev.Proc).ending.Load() {
			f.t.Fatalf("%s stopped while the test waited: %v", ev.Proc, ev)
		}
	}
}

// next returns the oldest event not yet returned, or false after timeout.
func (f *fleet) next(timeout <-chan time.Time) (event, bool) {
	if len(f.backlog) > 0 {
		ev := f.backlog[0]
		f.backlog = f.backlog[1:]
		return ev, true
	}
	select {
	case ev := <-f.events:
		return ev, true
	case <-timeout:
		return event{}, false
	}
}

// proc returns the process named name.
func (f *fleet) proc(name string) *proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.name == name {
			return p
		}
	}
	panic("no process " + name)
}

// release lets a held delivery go on.
func (p *proc) release(t *testing.T) {
	t.Helper()
	if _, err := fmt.Fprintln(p.stdin); err != nil {
		t.Fatal(err)
	}
}

// kill9 kills the process with SIGKILL and waits until it is gone.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	p.ending.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
}

// isPayment matches the consumer's log line for its verdict on key.
func isPayment(proc, key, verdict string) func(event) bool {
	return func(ev event) bool {
		return ev.Msg == "payment" && ev.Key == key && ev.Verdict == verdict && (proc == "" || ev.Proc == proc)
	}
}
