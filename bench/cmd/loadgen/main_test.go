package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/bench/internal/result"
)

// fakeServer answers the demo login and the order route: every third order
// a 503, the others a fresh 201. Its /counts is a pgrtt stand-in: two round
// trips per order, plus 100 for the first (a cold pool's connections and
// statements).
func fakeServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var orders, trips atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/demo/users", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"user_id":1,"token":"t"}`))
	})
	mux.HandleFunc("POST /api/trading/orders", func(w http.ResponseWriter, _ *http.Request) {
		n := orders.Add(1)
		trips.Add(2)
		if n == 1 {
			trips.Add(100)
		}
		if n%3 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(counts{RoundTrips: trips.Load(), Xacts: orders.Load()})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &orders
}

// TestSteadyCountsOnlyExpectedAnswers: the 503s fail the run and are no
// part of the requests or the req/s; round trips per request leave out the
// warm-up's (the cold first request's 100 included).
func TestSteadyCountsOnlyExpectedAnswers(t *testing.T) {
	srv, orders := fakeServer(t)
	o := options{url: srv.URL, mode: "unique", concurrency: 4, duration: 200 * time.Millisecond,
		warmup: 50 * time.Millisecond, timeout: 10 * time.Second, rttURL: srv.URL + "/counts", keys: 1, copies: 1, rounds: 1,
		path: orderPath, body: orderBody, login: true}
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // never hangs
	defer cancel()
	s, ok, err := run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Error("a run with 503s passed")
	}
	if s.Requests == 0 || s.Requests != s.Status["201"] {
		t.Errorf("requests %d, want the window's 201s (%v)", s.Requests, s.Status)
	}
	if s.Status["503"] == 0 || s.Unexpected < s.Status["503"] {
		t.Errorf("unexpected %d, status %v: want every 503 unexpected", s.Unexpected, s.Status)
	}
	if want := float64(s.Requests) / s.DurationS; s.RPS != want {
		t.Errorf("rps %v, want the 201s over the window, %v", s.RPS, want)
	}
	if s.RoundTripsPerReq != 2 || orders.Load() <= s.Requests {
		t.Errorf("%.3f round trips per request (after %d orders), want exactly 2", s.RoundTripsPerReq, orders.Load())
	}
}

// TestOtherRoute: with -path, -body and -login=false loadgen posts the body
// given to the route given, never asks for a session, and in hot mode
// counts the replays of its one key.
func TestOtherRoute(t *testing.T) {
	var (
		mu     sync.Mutex
		seen   = map[string]bool{}
		bodies = map[string]bool{}
		other  atomic.Int64
	)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /noop", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		replay := seen[key]
		seen[key], bodies[string(b)] = true, true
		mu.Unlock()
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		other.Add(1)
		w.WriteHeader(http.StatusNotFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	o := options{url: srv.URL, mode: "hot", concurrency: 2, duration: 100 * time.Millisecond,
		warmup: 10 * time.Millisecond, timeout: 10 * time.Second, keys: 1, copies: 1, rounds: 1,
		path: "/noop", body: `{"n":1}`, login: false}
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // never hangs
	defer cancel()
	s, ok, err := run(ctx, o)
	if err != nil || !ok {
		t.Fatalf("run: ok %v, err %v, summary %+v", ok, err, s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || len(bodies) != 1 || !bodies[`{"n":1}`] {
		t.Errorf("keys %v, bodies %v: want one key and the -body given", seen, bodies)
	}
	if other.Load() != 0 {
		t.Errorf("%d requests off /noop (a login?), want none", other.Load())
	}
	if s.Requests == 0 || s.Replayed != s.Requests {
		t.Errorf("requests %d, replayed %d: want every measured request a replay", s.Requests, s.Replayed)
	}
	o.mode = "storm"
	if o.check() == nil {
		t.Error("a storm on another route passed the check")
	}
}

// TestOutcome: a steady mode's answers are OK only as a 201 that is a
// replay exactly when the mode replays.
func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		a       answer
		err     error
		replays bool
		want    result.Outcome
	}{
		{answer{status: 201}, nil, false, result.OK},
		{answer{status: 201, replayed: true}, nil, true, result.OK},
		{answer{status: 201, replayed: true}, nil, false, result.Unexpected},
		{answer{status: 201}, nil, true, result.Unexpected},
		{answer{status: 409}, nil, false, result.Unexpected},
		{answer{status: 500}, nil, false, result.Unexpected},
		{answer{}, errors.New("connection reset"), false, result.Failed},
	} {
		if got := outcome(c.a, c.err, c.replays); got.Outcome != c.want || (c.err == nil && got.Status != c.a.status) {
			t.Errorf("outcome(%+v, %v, replays %v) = %+v, want %v", c.a, c.err, c.replays, got, c.want)
		}
	}
}

// TestDBPidsCmd: with -db-pids-cmd loadgen adds the CPU time of the
// processes the command lists (here a busy shell loop standing in for a
// database backend) to the summary, per request; a command that lists no
// process fails the run instead of reporting nothing.
func TestDBPidsCmd(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	mux := http.NewServeMux()
	// Each request takes a millisecond, so the window's requests leave the
	// busy loop's CPU well above a microsecond each even when CI's other
	// packages starve it.
	mux.HandleFunc("POST /noop", func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(time.Millisecond) // the request's own duration, not synchronisation
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	o := options{url: srv.URL, mode: "unique", concurrency: 2, duration: time.Second,
		warmup: 10 * time.Millisecond, timeout: 10 * time.Second, keys: 1, copies: 1, rounds: 1,
		path: "/noop", body: `{}`, login: false, dbPidsCmd: "echo " + strconv.Itoa(busy.Process.Pid)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // never hangs
	defer cancel()
	s, ok, err := run(ctx, o)
	if err != nil || !ok {
		t.Fatalf("run: ok %v, err %v", ok, err)
	}
	if s.CPUDBUs <= 0 {
		t.Errorf("cpu_db_us %v with a busy process listed, want > 0", s.CPUDBUs)
	}
	o.dbPidsCmd = "true"
	if _, _, err := run(ctx, o); err == nil || !strings.Contains(err.Error(), "no process id") {
		t.Errorf("a command listing nothing: err %v, want one saying so", err)
	}
}
