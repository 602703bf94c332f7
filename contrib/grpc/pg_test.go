package idemgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/internal/testdb"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// childDB is a migrated schema with the children's tables, and a pool on it.
func childDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	// connect_timeout: NewPostgresStore warns about a pool without one;
	// pool_max_conns: the storm's hundreds of concurrent claims per process
	// would otherwise queue for pgxpool's default of 4 past the store
	// timeout (saturation, Unavailable) on a loaded machine.
	dsn := testdb.NewDSN(t) + "&connect_timeout=5&pool_max_conns=16"
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), childDDL); err != nil {
		t.Fatal(err)
	}
	return dsn, pool
}

// TestStormAcrossProcesses: 32 concurrent duplicates of each of many keys,
// spread over two server processes sharing one database, execute exactly
// once per key; every duplicate gets the first answer or Aborted in
// flight (after retrying Unavailable, which a saturated pool on a loaded
// machine answers), never another answer.
func TestStormAcrossProcesses(t *testing.T) {
	t.Parallel()
	dsn, pool := childDB(t)
	servers := []*grpc.ClientConn{dial(t, startChild(t, dsn, false).Addr), dial(t, startChild(t, dsn, false).Addr)}
	const keys, dups = 24, 32
	var wg sync.WaitGroup
	var unavailable atomic.Int64
	answers := make([][dups]*testpb.SimpleResponse, keys)
	errs := make(chan error, keys*dups)
	for k := range keys {
		key := uuid.NewString()
		for d := range dups {
			wg.Go(func() {
				resp, err := invoke(withKey(t.Context(), key), servers[d%2], "Transfer", request(key, codes.OK))
				for attempt := 0; status.Code(err) == codes.Unavailable && attempt < 10; attempt++ {
					// Saturation on a loaded machine: retry the same key, as the answer invites.
					unavailable.Add(1)
					time.Sleep(100 * time.Millisecond)
					resp, err = invoke(withKey(t.Context(), key), servers[d%2], "Transfer", request(key, codes.OK))
				}
				switch {
				case err == nil:
					answers[k][d] = resp
				case status.Code(err) != codes.Aborted:
					errs <- fmt.Errorf("key %d: %v", k, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var wrong int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM (SELECT key FROM executions GROUP BY key HAVING count(*) <> 1) x`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	var total, pids int
	if err := pool.QueryRow(t.Context(), `SELECT count(DISTINCT key), count(DISTINCT pid) FROM executions`).Scan(&total, &pids); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 || total != keys {
		t.Fatalf("%d keys executed, %d of them not exactly once; want %d, each once", total, wrong, keys)
	}
	for k := range answers {
		var first *testpb.SimpleResponse
		for _, a := range answers[k] {
			if a != nil && first == nil {
				first = a
			} else if a != nil && !proto.Equal(a, first) {
				t.Fatalf("key %d: answers %v and %v differ", k, first, a)
			}
		}
	}
	t.Logf("%d keys x %d duplicates over 2 processes; executions came from %d of them; %d Unavailable answers retried", keys, dups, pids, unavailable.Load())
}

// TestCrashMidMethod: the server process is killed (SIGKILL) while a
// transactional method is running, after its write; the immediate retry
// on another server executes at once, and the method's effect exists once.
func TestCrashMidMethod(t *testing.T) {
	t.Parallel()
	dsn, pool := childDB(t)
	doomed, survivor := startChild(t, dsn, true), startChild(t, dsn, false)
	key := uuid.NewString()
	req := request("settle 10", codes.OK)
	lost := make(chan error, 1)
	go func() { _, err := invoke(withKey(t.Context(), key), dial(t, doomed.Addr), "Settle", req); lost <- err }()
	if line := doomed.Next(t, 30*time.Second); line != "STARTED "+key {
		t.Fatalf("doomed server: %q", line)
	}
	if err := doomed.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-lost; status.Code(err) != codes.Unavailable {
		t.Fatalf("the call to the killed server: %v; want Unavailable", err)
	}
	cc := dial(t, survivor.Addr)
	resp, err := invoke(withKey(t.Context(), key), cc, "Settle", req)
	if err != nil {
		t.Fatalf("the immediate retry: %v; want it executed", err)
	}
	var h metadata.MD
	again, err := invoke(withKey(t.Context(), key), cc, "Settle", req, grpc.Header(&h))
	if err != nil || !proto.Equal(resp, again) || !replayed(h) {
		t.Fatalf("the second retry: %v %v; want the replay of %v", again, err, resp)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM ledger WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// dbCount counts rows of query.
func dbCount(t *testing.T, pool *pgxpool.Pool, query string, args ...any) (n int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
