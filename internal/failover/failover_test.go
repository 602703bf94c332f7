//go:build failover

package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

const (
	storeTimeout = 2 * time.Second
	lease        = 10 * time.Second
	// hangBound is the generous "never hangs" bound on any answer: every
	// step of an order (claim, BEGIN, the INSERTs, the record) is bounded
	// by the store timeout.
	hangBound = 5 * storeTimeout

	warmUp       = 3 * time.Second  // load before the kill
	afterRecover = 3 * time.Second  // load after the first write on the new leader
	recoverBound = 60 * time.Second // the service must write again within this after the kill
	setupBound   = 90 * time.Second // the cluster must be up within this

	workers = 8 // goroutines sending orders with unique keys
	storms  = 2 // goroutines sending each of their keys 4 times at once
)

// TestFailover kills the Patroni leader (kill -9 of Patroni and its
// PostgreSQL) under load and checks what the service promised.
func TestFailover(t *testing.T) {
	c := startCluster(t)
	leader, standby := c.waitSync(t)
	t.Logf("leader %s, synchronous standby %s", leader.name, standby.name)

	srv := startServer(t, c)
	users := make([]string, 4)
	for i := range users {
		users[i] = srv.newUser(t)
	}

	ld := newLoad(srv, users)
	ld.start()
	time.Sleep(warmUp) // a period of load, not synchronisation
	leader.kill(t)
	// From here on no request can reach the old leader: every one of its
	// processes is gone, so a write that starts later is the new leader's.
	killed := time.Now()
	t.Logf("killed %s (patroni and postgres) at +%.1fs", leader.name, killed.Sub(ld.began).Seconds())
	recovered := ld.waitWrite(killed, recoverBound)
	if recovered.IsZero() {
		ld.stop()
		t.Fatalf("no order was written within %v of the kill: the service did not recover without a restart", recoverBound)
	}
	time.Sleep(afterRecover) // a period of load, not synchronisation
	ld.stop()

	// Clients retry what failed, once the service is back.
	retried := ld.retryFailed()

	rep := ld.report()
	t.Logf("requests %d: %v; retried after recovery %d: %v", rep.total, rep.byStatus, len(retried), countStatus(retried))
	t.Logf("latency max by status: %v (bound %v)", rep.maxLatency, hangBound)
	fmt.Printf("failover: %.1f seconds without writes (kill -9 of the leader; last write before %+.1fs, first after %+.1fs), first write on the new leader %.1fs after the kill\n",
		rep.gap.Seconds(), rep.lastBefore.Sub(killed).Seconds(), rep.firstAfter.Sub(killed).Seconds(), recovered.Sub(killed).Seconds())
	fmt.Printf("failover: answers %v; errors seen: %v\n", rep.byStatus, rep.errors)

	// Once the service is back, a client's retry of a key that failed
	// executes it, or answers 409 (its first try committed and is in
	// flight elsewhere, or failed): never 503 again.
	for _, r := range retried {
		if r.err == nil && r.status == 503 {
			t.Errorf("key %s: retried after recovery, still 503 %s", r.key, r.body)
		}
	}

	// Fail-closed: every answer is a 201, a 409 (a duplicate in flight, or
	// an outcome the store cannot know) or a 503, and none hangs.
	for _, r := range append(ld.all(), retried...) {
		switch {
		case r.err != nil:
			t.Errorf("key %s: no answer after %v: %v", r.key, r.latency, r.err)
		case r.status != 201 && r.status != 409 && r.status != 503:
			t.Errorf("key %s: answer %d %s, want 201, 409 or 503", r.key, r.status, r.body)
		case r.latency > hangBound:
			t.Errorf("key %s: answered %d after %v, over the %v bound", r.key, r.status, r.latency, hangBound)
		}
	}

	// The database, read on the new leader.
	conn, err := pgx.Connect(t.Context(), standby.dsn())
	if err != nil {
		t.Fatalf("connect to the new leader: %v", err)
	}
	defer conn.Close(context.Background())
	dups, err := pgx.CollectRows(query(t, conn,
		`SELECT client_order_id || ' x' || count(*) FROM paper_orders GROUP BY client_order_id HAVING count(*) > 1`), pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(dups) > 0 {
		t.Errorf("orders executed twice (key x count): %v", dups)
	}
	acked := map[int64]string{} // order id -> key, from every 201
	for _, r := range append(ld.all(), retried...) {
		if r.status != 201 {
			continue
		}
		if prev, ok := acked[r.orderID]; ok && prev != r.key {
			t.Errorf("order %d acknowledged for keys %s and %s", r.orderID, prev, r.key)
		}
		acked[r.orderID] = r.key
	}
	ids := make([]int64, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	found, err := pgx.CollectRows(query(t, conn,
		`SELECT id, client_order_id FROM paper_orders WHERE id = ANY($1)`, ids), pgx.RowToStructByPos[struct {
		ID  int64
		Key string
	}])
	if err != nil {
		t.Fatal(err)
	}
	present := map[int64]string{}
	for _, f := range found {
		present[f.ID] = f.Key
	}
	for id, key := range acked {
		if got, ok := present[id]; !ok || got != key {
			t.Errorf("order %d (key %s) was acknowledged with 201 but is missing after the failover (found %q)", id, key, got)
		}
	}
	t.Logf("%d acknowledged orders all present on the new leader; no key executed twice", len(acked))
}

// query runs sql on conn, failing the test on an error.
func query(t *testing.T, conn *pgx.Conn, sql string, args ...any) pgx.Rows {
	rows, err := conn.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return rows
}

// ---- the cluster ----

type cluster struct {
	mu      sync.Mutex // guards nodes and started against the watchdog
	dir     string
	as      *syscall.Credential
	etcd    string // client host:port
	nodes   []*node
	binDir  string
	scope   string
	started []*proc
}

type node struct {
	c        *cluster
	name     string
	pgPort   int
	restPort int
	dataDir  string
	patroni  *proc
}

// proc is a process started by the test, stopped by its pid.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func startCluster(t *testing.T) *cluster {
	for _, bin := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: install the Debian packages patroni and etcd-server (.ci/run does)", bin)
		}
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		t.Fatal("no /usr/lib/postgresql/*/bin/postgres: install postgresql")
	}
	sort.Strings(bins)
	dir, err := os.MkdirTemp("", "idem-failover-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{dir: dir, binDir: filepath.Dir(bins[len(bins)-1]), scope: "idem-failover"}
	// go test's -timeout panics without running cleanups, and PostgreSQL,
	// started by Patroni, would outlive the test: kill everything shortly
	// before that.
	if d, ok := t.Deadline(); ok {
		watchdog := time.AfterFunc(time.Until(d)-20*time.Second, func() {
			t.Errorf("killing the cluster: the test is about to time out")
			c.killAll()
		})
		t.Cleanup(func() { watchdog.Stop() })
	}
	t.Cleanup(func() {
		c.stopAll(t)
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", dir)
		}
	})
	if os.Geteuid() == 0 { // PostgreSQL and Patroni refuse root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root and there is no postgres user: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.as = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
	}

	ports := freePorts(t, 6)
	c.etcd = fmt.Sprintf("127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	c.start(t, "etcd", "etcd", "--name", "e1", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://"+c.etcd, "--advertise-client-urls", "http://"+c.etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "e1="+peer, "--unsafe-no-fsync")
	waitFor(t, "etcd answering", setupBound, func() error {
		_, err := httpGet("http://" + c.etcd + "/health")
		return err
	})

	for i := range 2 {
		n := &node{c: c, name: fmt.Sprintf("node%d", i+1), pgPort: ports[2+i], restPort: ports[4+i]}
		n.dataDir = filepath.Join(dir, n.name)
		c.mu.Lock()
		c.nodes = append(c.nodes, n)
		c.mu.Unlock()
		cfg := filepath.Join(dir, n.name+".yml")
		c.writeFile(t, cfg, n.config())
		n.patroni = c.start(t, n.name, "patroni", cfg)
		if i == 0 { // the first node bootstraps the cluster and leads
			waitFor(t, n.name+" leading", setupBound, func() error {
				_, err := httpGet(n.rest("/primary"))
				return err
			})
		}
	}
	return c
}

// config is the node's Patroni configuration: ttl 10 s and loop_wait 1 s
// (a failover about 10 s after the leader dies), synchronous mode.
func (n *node) config() string {
	c := n.c
	return fmt.Sprintf(`scope: %s
name: %s
restapi:
  listen: 127.0.0.1:%d
  connect_address: 127.0.0.1:%d
etcd3:
  hosts: %s
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 100
        max_wal_senders: 5
        max_replication_slots: 5
        wal_level: replica
        hot_standby: "on"
  initdb:
    - encoding: UTF8
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%d
  connect_address: 127.0.0.1:%d
  data_dir: %s
  bin_dir: %s
  pgpass: %s
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  basebackup:
    - checkpoint: fast
  parameters:
    unix_socket_directories: %s
    fsync: "off"
`, c.scope, n.name, n.restPort, n.restPort, c.etcd, n.pgPort, n.pgPort, n.dataDir, c.binDir,
		filepath.Join(c.dir, n.name+".pgpass"), c.dir)
}

func (n *node) rest(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", n.restPort, path)
}

func (n *node) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", n.pgPort)
}

// waitSync waits until one node leads and the other streams as its
// synchronous standby.
func (c *cluster) waitSync(t *testing.T) (leader, standby *node) {
	waitFor(t, "a leader and a synchronous standby", setupBound, func() error {
		body, err := httpGet(c.nodes[0].rest("/cluster"))
		if err != nil {
			return err
		}
		var cl struct {
			Members []struct{ Name, Role, State string }
		}
		if err := json.Unmarshal(body, &cl); err != nil {
			return err
		}
		leader, standby = nil, nil
		for _, m := range cl.Members {
			for _, n := range c.nodes {
				switch {
				case n.name != m.Name:
				case m.Role == "leader" && m.State == "running":
					leader = n
				case m.Role == "sync_standby" && (m.State == "streaming" || m.State == "running"):
					standby = n
				}
			}
		}
		if leader == nil || standby == nil {
			return fmt.Errorf("members %+v", cl.Members)
		}
		return nil
	})
	return leader, standby
}

// kill kills the node as a crash would: Patroni, the postmaster and every
// backend, each with SIGKILL (backends whose postmaster alone died would
// go on serving their connections for a moment).
func (n *node) kill(t *testing.T) {
	pm := n.postmaster()
	if pm == 0 {
		t.Fatalf("%s: no running postmaster", n.name)
	}
	_ = syscall.Kill(-n.patroni.cmd.Process.Pid, syscall.SIGKILL)
	children := childrenOf(pm)
	_ = syscall.Kill(pm, syscall.SIGKILL)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-n.patroni.done
	// SIGKILL is delivered asynchronously: wait until the postmaster and
	// every backend are gone (no /proc entry, or a zombie), so the caller
	// knows no statement can still commit on this node.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range append(children, pm) {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: process %d still alive 10s after SIGKILL", n.name, pid)
			}
			time.Sleep(5 * time.Millisecond) // polling /proc: there is nothing to wait on for a non-child
		}
	}
}

// alive reports whether pid runs: it has a /proc entry and is not a
// zombie (a killed process whose parent has not reaped it yet).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// childrenOf returns the pids whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ")".
		i := bytes.LastIndexByte(b, ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
			out = append(out, child)
		}
	}
	return out
}

// postmaster returns the pid in the node's postmaster.pid when that process
// is a postgres, else 0.
func (n *node) postmaster() int {
	b, err := os.ReadFile(filepath.Join(n.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return 0
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || filepath.Base(exe) != "postgres" {
		return 0
	}
	return pid
}

// start starts a process as the cluster's user, in a process group of its
// own, with its output in dir/name.log.
func (c *cluster) start(t *testing.T, name, bin string, args ...string) *proc {
	logf, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "HOME="+c.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: c.as}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.mu.Lock()
	c.started = append(c.started, p)
	c.mu.Unlock()
	return p
}

// stopAll kills every process the test started, by pid (and process
// group), and every node's PostgreSQL, and waits for them.
func (c *cluster) stopAll(t *testing.T) {
	c.killAll()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.started) - 1; i >= 0; i-- {
		p := c.started[i]
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
}

// killAll signals every node's PostgreSQL and every process the test
// started, without waiting.
func (c *cluster) killAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.started { // Patroni first: it would restart PostgreSQL
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	for _, n := range c.nodes {
		if pid := n.postmaster(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown, backends included
		}
	}
}

func (c *cluster) writeFile(t *testing.T, path, text string) {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.as != nil {
		if err := os.Chown(path, int(c.as.Uid), int(c.as.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// ---- the example server ----

type server struct {
	base string
	hc   *http.Client
}

// startServer builds and starts the example server on a multi-host DSN
// that only accepts the read-write node.
func startServer(t *testing.T, c *cluster) *server {
	bin := filepath.Join(t.TempDir(), "server")
	build := exec.Command("go", "build", "-o", bin, "./examples/server")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example server: %v\n%s", err, out)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		c.nodes[0].pgPort, c.nodes[1].pgPort)
	logf, err := os.Create(filepath.Join(c.dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-addr", addr, "-database-url", dsn,
		"-store-timeout", storeTimeout.String(), "-lease", lease.String())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: "server", cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	s := &server{base: "http://" + addr, hc: &http.Client{Timeout: 2 * hangBound, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(s.hc.CloseIdleConnections)
	waitFor(t, "the example server", setupBound, func() error {
		select {
		case <-p.done:
			t.Fatalf("the example server exited; see %s", filepath.Join(c.dir, "server.log"))
		default:
		}
		_, err := httpGet(s.base + "/healthz")
		return err
	})
	return s
}

func (s *server) newUser(t *testing.T) string {
	res, err := s.post("/api/demo/users", "", "", `{"name":"failover"}`)
	if err != nil || res.status != 201 {
		t.Fatalf("create user: %v %+v", err, res)
	}
	var out struct{ Token string }
	if err := json.Unmarshal(res.body, &out); err != nil || out.Token == "" {
		t.Fatalf("create user: %s", res.body)
	}
	return out.Token
}

// result is one answer as the load saw it.
type result struct {
	key      string
	token    string
	start    time.Time
	latency  time.Duration
	status   int
	body     []byte
	orderID  int64
	replay   bool
	err      error
	errLabel string
}

func (s *server) post(path, token, key, body string) (result, error) {
	r := result{key: key, token: token, start: time.Now()}
	req, err := http.NewRequest("POST", s.base+path, strings.NewReader(body))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := s.hc.Do(req)
	if err == nil {
		r.body, err = io.ReadAll(res.Body)
		res.Body.Close()
		r.status = res.StatusCode
	}
	r.latency = time.Since(r.start)
	r.err = err
	var out struct {
		ID       int64  `json:"id"`
		Replayed bool   `json:"idempotency_replayed"`
		Error    string `json:"error"`
	}
	_ = json.Unmarshal(r.body, &out)
	r.orderID, r.replay = out.ID, out.Replayed
	r.errLabel = out.Error
	return r, err
}

func (s *server) order(token, key string) result {
	r, _ := s.post("/api/trading/orders", token, key, `{"symbol":"AAPL","side":"buy","qty":1}`)
	return r
}

// ---- the load ----

type load struct {
	srv   *server
	users []string
	began time.Time
	quit  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	results []result
	wrote   chan result // each fresh 201
}

func newLoad(srv *server, users []string) *load {
	return &load{srv: srv, users: users, quit: make(chan struct{}), wrote: make(chan result, 1<<16)}
}

func (l *load) record(r result) {
	l.mu.Lock()
	l.results = append(l.results, r)
	l.mu.Unlock()
	if r.err == nil && r.status == 201 && !r.replay {
		select {
		case l.wrote <- r:
		default: // nobody is waiting for it
		}
	}
}

func (l *load) start() {
	l.began = time.Now()
	for i := range workers + storms {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			token := l.users[i%len(l.users)]
			for n := 0; ; n++ {
				select {
				case <-l.quit:
					return
				default:
				}
				key := uuid.NewString()
				if i < workers {
					l.record(l.srv.order(token, key))
					continue
				}
				// A duplicate storm: the same key four times at once.
				var sw sync.WaitGroup
				for range 4 {
					sw.Add(1)
					go func() { defer sw.Done(); l.record(l.srv.order(token, key)) }()
				}
				sw.Wait()
			}
		}()
	}
}

// waitWrite waits for a fresh order whose request began after since, up to
// bound; it returns its completion time, or zero.
func (l *load) waitWrite(since time.Time, bound time.Duration) time.Time {
	deadline := time.After(bound)
	for {
		select {
		case r := <-l.wrote:
			if r.start.After(since) {
				return r.start.Add(r.latency)
			}
		case <-deadline:
			return time.Time{}
		}
	}
}

func (l *load) stop() {
	close(l.quit)
	l.wg.Wait()
}

func (l *load) all() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]result(nil), l.results...)
}

// retryFailed sends once more, as a client would, every key that got no
// 201: it must now answer 201 (run once) or 409, never run twice.
func (l *load) retryFailed() []result {
	seen := map[string]bool{}
	var keys []result
	for _, r := range l.all() {
		if r.status != 201 && !seen[r.key] {
			seen[r.key] = true
			keys = append(keys, r)
		}
	}
	out := make([]result, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, r := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = l.srv.order(r.token, r.key)
		}()
	}
	wg.Wait()
	return out
}

type report struct {
	total                  int
	byStatus               map[string]int
	errors                 map[string]int
	maxLatency             map[string]time.Duration
	gap                    time.Duration
	lastBefore, firstAfter time.Time
}

func (l *load) report() report {
	rep := report{byStatus: map[string]int{}, errors: map[string]int{}, maxLatency: map[string]time.Duration{}}
	var writes []time.Time
	for _, r := range l.all() {
		rep.total++
		label := strconv.Itoa(r.status)
		switch {
		case r.err != nil:
			label = "no answer"
			rep.errors[r.err.Error()]++
		case r.status == 201 && r.replay:
			label = "201 replay"
		case r.status == 201:
			writes = append(writes, r.start.Add(r.latency))
		default:
			label += " " + r.errLabel
			rep.errors[label]++
		}
		rep.byStatus[label]++
		rep.maxLatency[label] = max(rep.maxLatency[label], r.latency.Round(time.Millisecond))
	}
	sort.Slice(writes, func(i, j int) bool { return writes[i].Before(writes[j]) })
	for i := 1; i < len(writes); i++ {
		if g := writes[i].Sub(writes[i-1]); g > rep.gap {
			rep.gap, rep.lastBefore, rep.firstAfter = g, writes[i-1], writes[i]
		}
	}
	return rep
}

func countStatus(rs []result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		label := strconv.Itoa(r.status)
		if r.err != nil {
			label = "no answer"
		} else if r.errLabel != "" {
			label += " " + r.errLabel
		} else if r.replay {
			label += " replay"
		}
		m[label]++
	}
	return m
}

// ---- helpers ----

// waitFor polls f until it succeeds or bound passes (polling another
// process's state; there is nothing to wait on).
func waitFor(t *testing.T, what string, bound time.Duration, f func() error) {
	deadline := time.Now().Add(bound)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up after %v: %v", what, bound, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func httpGet(url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != 200 {
		return body, fmt.Errorf("%s: %d %s", url, res.StatusCode, bytes.TrimSpace(body))
	}
	return body, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}
