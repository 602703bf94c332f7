//go:build matrix

package matrix

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/sqlstore"
)

// kill -9 mid-handler: the entry point (or Do's consumer, settled-r4 item
// 11) runs in a child process of this test binary over the cell's
// database; its handler makes its effect and blocks; the child is killed
// with SIGKILL; a fresh child serves the retry. A transactional key is
// free (nothing committed) and executes once; an ordinary key's claim
// committed: its retries answer 409 in flight, then outcome_unknown once
// the lease is over, and it never runs again (item 26).

// Environment of a child (TestMatrixChild).
const (
	envChild      = "MATRIX_CHILD"       // the column, as column.String prints it
	envChildDSN   = "MATRIX_CHILD_DSN"   // the store's database, in its driver's form
	envChildBlock = "MATRIX_CHILD_BLOCK" // 1: the handler blocks after its effect
	envChildBeat  = "MATRIX_CHILD_BEAT"  // true: the route renews its lease (RouteConfig.Heartbeat)
	envSealKeys   = "MATRIX_SEAL_KEYS"   // the sealing keys, shared with the parent
	// envChildDerive: 1 makes the child derive under deriveKeys and print
	// each id it derived (fault_derive_test.go).
	envChildDerive = "MATRIX_CHILD_DERIVE"
)

func crashFault() *fault {
	return &fault{name: "kill -9 mid-handler", na: needsDB(naMemoryCr), run: func(t *testing.T, c cell) { runCrash(t, c, false) }}
}

// runCrash is the kill -9 row; heartbeat: the children's route renews its
// lease, which stops with the process, so the key is stale one lease
// after the kill all the same.
func runCrash(t *testing.T, c cell, heartbeat bool) {
	e := newEnv(t, c, envOpts{})
	doomed := startChild(t, e, true, heartbeat)
	key := newKey()
	go func() {
		// Never answers once its handler ran: the child dies. A claim the
		// loaded child was refused before that (503, 409 in flight) is
		// sent again after Retry-After, as a client would.
		for range 4 {
			a := doomed.call(e, key)
			if doomed.ranCount(key) > 0 || a.code != "idempotency_store_unavailable" && a.code != "idempotency_in_flight" {
				return
			}
			time.Sleep(time.Second) // Retry-After, not a synchronisation
		}
	}()
	if !doomed.waitRan(key, 30*time.Second) {
		e.failf("the child's handler never ran")
		return
	}
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = doomed.cmd.Wait()
	fresh := startChild(t, e, false, heartbeat)
	again := fresh.call(e, key)
	e.within("retry after the crash", again, 0)
	if c.v.tx {
		// The database ends the dead process's transaction once it sees
		// the socket closed: until then the key's row lock answers 409 in
		// flight, and a client that honours Retry-After comes back.
		for i := 0; i < 4 && again.code == "idempotency_in_flight"; i++ {
			time.Sleep(time.Second) // Retry-After, not a synchronisation
			again = fresh.call(e, key)
		}
		e.expect("transactional retry after the crash", again, "")
		e.atMostOnce(key, 1)
		return
	}
	if again.code != "idempotency_in_flight" && again.code != "idempotency_outcome_unknown" {
		e.failf("ordinary retry after the crash: want idempotency_in_flight or idempotency_outcome_unknown, got %v", again)
	}
	time.Sleep(lease) // waiting out the crashed owner's lease, not a synchronisation
	late := fresh.call(e, key)
	e.expect("ordinary retry after the lease", late, "idempotency_outcome_unknown")
	if n := doomed.ranCount(key) + fresh.ranCount(key); n != 1 {
		e.failf("the key's handler ran %d times across the two processes, want 1", n)
	}
}

// child is a server process of the matrix.
type child struct {
	cmd   *exec.Cmd
	stdin io.Writer
	addr  string

	mu      sync.Mutex
	derived map[string]string // the id the handler derived for a key (DERIVED)
	ran     map[string]int
	ranCh   chan string
	answers map[string]chan answer
}

// startChild starts this test binary as the column's entry point over the
// cell's database and waits for its address; it is killed when the cell
// ends.
func startChild(t *testing.T, e *env, block, heartbeat bool) *child {
	return startChildEnv(t, e, block, fmt.Sprintf("%s=%v", envChildBeat, heartbeat))
}

// startChildEnv is startChild with more variables in the child's
// environment.
func startChildEnv(t *testing.T, e *env, block bool, env ...string) *child {
	cmd := exec.Command(os.Args[0], "-test.run=^TestMatrixChild$", "-test.timeout=0")
	cmd.Env = append(os.Environ(), envChild+"="+e.c.column.String(), envChildDSN+"="+e.se.directDSN,
		fmt.Sprintf("%s=%v", envChildBlock, block), envSealKeys+"="+sealKeyText())
	cmd.Env = append(cmd.Env, env...)
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
	ch := &child{cmd: cmd, stdin: stdin, ran: map[string]int{}, ranCh: make(chan string, 16), answers: map[string]chan answer{}, derived: map[string]string{}}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go ch.read(stdout, addr)
	select {
	case a := <-addr:
		ch.addr = a
	case <-time.After(30 * time.Second):
		t.Fatal("the child announced no address in 30 s")
	}
	return ch
}

// read dispatches the child's lines: ADDR, DERIVED key id, RAN key,
// ANSWER key json.
func (ch *child) read(r io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		word, rest, _ := strings.Cut(sc.Text(), " ")
		switch word {
		case "ADDR":
			addr <- rest
		case "DERIVED":
			key, id, _ := strings.Cut(rest, " ")
			ch.mu.Lock()
			ch.derived[key] = id
			ch.mu.Unlock()
		case "RAN":
			ch.mu.Lock()
			ch.ran[rest]++
			ch.mu.Unlock()
			ch.ranCh <- rest
		case "ANSWER":
			key, js, _ := strings.Cut(rest, " ")
			var w wireAnswer
			_ = json.Unmarshal([]byte(js), &w)
			ch.answerCh(key) <- w.answer()
		}
	}
}

func (ch *child) answerCh(key string) chan answer {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.answers[key] == nil {
		ch.answers[key] = make(chan answer, 4)
	}
	return ch.answers[key]
}

// waitRan waits until the child's handler ran key.
func (ch *child) waitRan(key string, limit time.Duration) bool {
	deadline := time.After(limit)
	for {
		select {
		case k := <-ch.ranCh:
			if k == key {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

func (ch *child) ranCount(key string) int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.ran[key]
}

// call sends key to the child's entry point (Do: through its stdin).
func (ch *child) call(e *env, key string) answer {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), e.bound()+5*time.Second)
	defer cancel()
	var a answer
	switch e.c.entry {
	case entryHTTP:
		a = httpClient(e, ch.addr)(ctx, key, []byte(`{"amount":10}`))
	case entryGRPC:
		a = grpcClient(e, ch.addr)(ctx, key, []byte(`{"amount":10}`))
	case entryConnect:
		a = connectClient(e, ch.addr)(ctx, key, []byte(`{"amount":10}`))
	case entryDo:
		fmt.Fprintf(ch.stdin, "CALL %s\n", key)
		select {
		case a = <-ch.answerCh(key):
		case <-ctx.Done():
			a = answer{err: ctx.Err()}
		}
	}
	a.took = time.Since(start)
	return a
}

// wireAnswer is an answer on the child's stdout.
type wireAnswer struct {
	Handler, Replayed bool
	Status            int
	Code, Err         string
}

func (w wireAnswer) answer() answer {
	a := answer{handler: w.Handler, replayed: w.Replayed, status: w.Status, code: w.Code}
	if w.Err != "" {
		a.err = fmt.Errorf("%s", w.Err)
	}
	return a
}

// TestMatrixChild is the child's main: it serves the column's entry point
// over the store at MATRIX_CHILD_DSN until killed. Without MATRIX_CHILD
// it does nothing.
func TestMatrixChild(t *testing.T) {
	spec := os.Getenv(envChild)
	if spec == "" {
		t.Skip("run by the kill -9 cells only")
	}
	c := parseColumn(t, spec)
	block := os.Getenv(envChildBlock) == "true"
	e := &env{t: t, c: cell{column: c, fault: &fault{name: "child"}}, runs: map[string]int{}, reasons: map[string]int{}}
	e.enabled.Store(true)
	e.se = childStore(t, c, os.Getenv(envChildDSN))
	derive := os.Getenv(envChildDerive) == "1"
	cfg := idempotency.Config{Lease: lease, StoreTimeout: storeTimeout, Logger: quiet,
		Enabled: func(context.Context) bool { return true }}
	if derive {
		cfg.DeriveKeys = deriveKeys(t)
	}
	mw, err := idempotency.New(e.se.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.mw = mw
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := hc.effect(ctx); err != nil {
			return failure(err)
		}
		if derive {
			say("DERIVED %s %s", hc.key, derivedID(ctx))
		}
		say("RAN %s", hc.key)
		if block {
			select {} // until SIGKILL
		}
		return 201, fmt.Appendf(nil, `{"ok":true,"key":%q}`, hc.key)
	}
	rc := idempotency.RouteConfig{FailOpen: c.v.open, Transactional: c.v.tx, MinKeyLength: 16}
	if c.entry == entryHTTP {
		rc.MinKeyLength = 0
	}
	if os.Getenv(envChildBeat) == "true" {
		rc.Heartbeat, rc.MaxRun = true, 10*lease
	}
	call, err := entryServers[c.entry](e, rc, e.counted(h))
	if err != nil {
		t.Fatal(err)
	}
	say("ADDR %s", e.addr)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		key, ok := strings.CutPrefix(sc.Text(), "CALL ")
		if !ok {
			continue
		}
		go func() {
			a := call(context.Background(), key, []byte(`{"amount":10}`))
			w := wireAnswer{Handler: a.handler, Replayed: a.replayed, Status: a.status, Code: a.code}
			if a.err != nil {
				w.Err = a.err.Error()
			}
			js, _ := json.Marshal(w)
			say("ANSWER %s %s", key, js)
		}()
	}
}

// parseColumn reads column.String's form.
func parseColumn(t *testing.T, s string) column {
	p := strings.Split(s, "/")
	if len(p) != 5 {
		t.Fatalf("column %q", s)
	}
	return column{entryKind(p[0]), storeKind(p[1]), variant{tx: p[2] == "tx", open: p[3] == "open", sealed: p[4] == "sealed"}}
}

// childStore opens the column's store on dsn (no proxy, no new schema:
// the parent's).
func childStore(t *testing.T, c column, dsn string) *storeEnv {
	se := &storeEnv{kind: c.store}
	switch c.store {
	case storePgx:
		pool, err := pgxpool.New(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		se.store = idempotency.NewPostgresStore(pool)
	default:
		driver := map[storeKind]string{storeSQLPgx: "pgx", storeSQLPq: "postgres", storeMySQL: "mysql"}[c.store]
		dialect := sqlstore.PostgreSQL
		if c.store.mysql() {
			dialect = sqlstore.MySQL
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		se.store = newSQLStore(t, db, dialect)
	}
	if c.v.sealed {
		sealed, err := idempotency.NewSealingStore(t.Context(), se.store, sealKeys())
		if err != nil {
			t.Fatal(err)
		}
		se.store = sealed
	}
	return se
}
