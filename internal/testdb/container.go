package testdb

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Bounds on finding and starting a container.
const (
	pingTimeout    = 3 * time.Second // a Docker engine answering /_ping
	buildTimeout   = 5 * time.Minute // building pgcontainer (downloads its modules the first time)
	containerStart = 2 * time.Minute // pgcontainer pulling and starting the image
	containerStop  = 2 * time.Minute // pgcontainer terminating the container
	helperModule   = "pgcontainer"   // the program's directory, beside this file
	pingPath       = "http://docker/_ping"
)

// shared is the container started for this test binary, if any.
var shared struct {
	once   sync.Once
	url    string
	err    error
	cmd    *exec.Cmd      // the pgcontainer process
	stdin  io.WriteCloser // closing it makes pgcontainer terminate the container
	done   chan struct{}  // closed when the process has exited
	dir    string         // where its binary was built
	stderr *bytes.Buffer  // read only after done
}

// containerURL starts, once per test binary, a PostgreSQL container when a
// Docker engine answers quickly, and returns its URL.
func containerURL() (string, error) {
	shared.once.Do(func() {
		host, err := dockerHost(pingTimeout)
		if err != nil {
			shared.err = err
			return
		}
		shared.url, shared.err = startContainer(host)
	})
	return shared.url, shared.err
}

// dockerHosts returns the addresses where a Docker engine may listen:
// DOCKER_HOST when set, else the default socket, the rootless one and
// Docker Desktop's (the places testcontainers-go looks too).
func dockerHosts() []string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return []string{h}
	}
	hosts := []string{"unix:///var/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		hosts = append(hosts, "unix://"+filepath.Join(d, "docker.sock"))
	}
	if d, err := os.UserHomeDir(); err == nil {
		hosts = append(hosts, "unix://"+filepath.Join(d, ".docker", "run", "docker.sock"))
	}
	return hosts
}

// dockerHost returns the first of dockerHosts whose engine answers GET
// /_ping with 200 within timeout, or an error naming each one tried and
// why it did not answer. A tcp:// DOCKER_HOST with DOCKER_TLS_VERIFY set
// is returned unchecked (the check speaks plain HTTP): pgcontainer, through
// testcontainers-go, speaks TLS and says so if it does not answer.
func dockerHost(timeout time.Duration) (string, error) {
	var why []string
	for _, h := range dockerHosts() {
		err := pingDocker(h, timeout)
		if err == nil {
			return h, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", h, err))
	}
	return "", fmt.Errorf("no Docker engine answered (%s)", strings.Join(why, "; "))
}

// pingDocker sends GET /_ping to the engine at host (unix:// or tcp://,
// as in DOCKER_HOST) and wants 200 within timeout.
func pingDocker(host string, timeout time.Duration) error {
	u, err := url.Parse(host)
	if err != nil {
		return err
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
		if _, err := os.Stat(addr); errors.Is(err, fs.ErrNotExist) {
			return errors.New("no socket")
		}
	case "tcp":
		if os.Getenv("DOCKER_TLS_VERIFY") != "" {
			return nil
		}
		network, addr = "tcp", u.Host
	default:
		return fmt.Errorf("scheme %q not supported here (unix:// or tcp://)", u.Scheme)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true, // no idle connection (nor goroutine) left behind
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pingPath, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/_ping answered %s", resp.Status)
	}
	return nil
}

// helperDir returns the source directory of the pgcontainer program:
// beside this file, else (a binary built with -trimpath) found by walking
// up from the working directory.
func helperDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		d := filepath.Join(filepath.Dir(file), helperModule)
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		p := filepath.Join(d, "internal", "testdb", helperModule)
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
			return p, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("cannot find the %s program's source (internal/testdb/%s) from %s", helperModule, helperModule, wd)
		}
	}
}

// startContainer builds pgcontainer (its own module, so testcontainers-go
// stays out of the root go.mod), runs it against the engine at host and
// reads the container's URL from its first line of output. The process
// stays running, its stdin a pipe from this one, until stopContainer or
// this process's exit closes the pipe.
func startContainer(host string) (string, error) {
	src, err := helperDir()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command, to build %s: %w", src, err)
	}
	dir, err := os.MkdirTemp("", "idem-pgcontainer-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, helperModule)
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("build %s: %v: %s", src, err, lastLines(string(out), 5))
	}

	cmd := exec.Command(bin, "-timeout", containerStart.String())
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+host)
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err == nil {
		var stdout io.ReadCloser
		if stdout, err = cmd.StdoutPipe(); err == nil {
			err = cmd.Start()
			if err == nil {
				return awaitURL(cmd, stdin, stdout, stderr, dir)
			}
		}
	}
	_ = os.RemoveAll(dir)
	return "", fmt.Errorf("start %s: %w", bin, err)
}

// awaitURL reads the started pgcontainer's first line, its container's URL,
// and records the process in shared; or, when it exits or takes too long,
// returns why.
func awaitURL(cmd *exec.Cmd, stdin io.WriteCloser, stdout io.Reader, stderr *bytes.Buffer, dir string) (string, error) {
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- l
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(containerStart + 30*time.Second): // pgcontainer bounds itself; this is a backstop
		_ = cmd.Process.Kill()
		line = <-lines // its stdout closed with it
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	if !strings.HasSuffix(line, "\n") {
		_ = stdin.Close()
		<-done
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("%s printed no URL: %v: %s", helperModule, cmd.ProcessState, lastLines(stderr.String(), 5))
	}
	shared.cmd, shared.stdin, shared.done, shared.dir, shared.stderr = cmd, stdin, done, dir, stderr
	return strings.TrimSpace(line), nil
}

// stopContainer has the pgcontainer started, if any, terminate its
// container (by closing its stdin), waits for it to exit and removes its
// binary.
func stopContainer() {
	if shared.cmd == nil {
		return
	}
	_ = shared.stdin.Close()
	select {
	case <-shared.done:
	case <-time.After(containerStop): // pgcontainer bounds the termination itself; Ryuk reaps what is left
		_ = shared.cmd.Process.Kill()
		<-shared.done
	}
	if !shared.cmd.ProcessState.Success() {
		fmt.Fprintf(os.Stderr, "testdb: %s: %v: %s\n", helperModule, shared.cmd.ProcessState, lastLines(shared.stderr.String(), 5))
	}
	_ = os.RemoveAll(shared.dir)
	shared.cmd = nil
}
