package idemgrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// TestTransactional: a transactional method's writes commit with the
// key's record; a failing one's roll back (the key fails all the same);
// an answer over the buffer rolls back and is Internal
// IDEMPOTENCY_RESPONSE_TOO_LARGE.
func TestTransactional(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, _ := newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{})
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		tx, ok := idempotency.TxFromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no transaction")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, keyOf(ctx)); err != nil {
			return nil, err
		}
		return answer(req, "1")
	}
	tx := idempotency.RouteConfig{Transactional: true, MaxResponseBytes: 64}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{svc + "Settle": {RequireKey: true, Route: tx}}, h, "Settle"))
	rows := func(key string) int { return dbCount(t, pool, `SELECT count(*) FROM ledger WHERE key = $1`, key) }

	ok := uuid.NewString()
	first, err := invoke(withKey(t.Context(), ok), cc, "Settle", request("settle", codes.OK))
	if err != nil || rows(ok) != 1 || dbCount(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1 AND status = 'completed'
		AND scope_endpoint = 'grpc:/idem.test.Payments/Settle' AND response_code = 200 AND convert_from(response_headers, 'UTF8')::jsonb ? ':rpc'`, ok) != 1 {
		t.Fatalf("completed: %v; %d ledger rows, want 1 beside the key completed as grpc:/...Settle, 200, :rpc", err, rows(ok))
	}
	var h2 metadata.MD
	if again, err := invoke(withKey(t.Context(), ok), cc, "Settle", request("settle", codes.OK), grpc.Header(&h2)); err != nil || !proto.Equal(first, again) || !replayed(h2) || rows(ok) != 1 {
		t.Fatalf("retry: %v %v; want the replay, one ledger row", again, err)
	}

	failed := uuid.NewString()
	if _, err := invoke(withKey(t.Context(), failed), cc, "Settle", request("settle", codes.Internal)); status.Code(err) != codes.Internal || rows(failed) != 0 {
		t.Fatalf("failing: %v with %d ledger rows; want Internal and its write rolled back", err, rows(failed))
	}
	_, err = invoke(withKey(t.Context(), failed), cc, "Settle", request("settle", codes.Internal))
	wantAnswer(t, "after a failure", err, codes.FailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED", 0)

	big := uuid.NewString()
	_, err = invoke(withKey(t.Context(), big), cc, "Settle", request(strings.Repeat("x", 1024), codes.OK))
	wantAnswer(t, "over the buffer", err, codes.Internal, "IDEMPOTENCY_RESPONSE_TOO_LARGE", 0)
	if rows(big) != 0 {
		t.Fatalf("%d ledger rows after an answer over the buffer, want 0", rows(big))
	}
}

// TestStoreCut: with the store's connection cut, a fail-closed method
// answers Unavailable IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo and
// does not run; a fail-open one runs without deduplication (an outage is
// the class that allows a bypass).
func TestStoreCut(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testdb.NewDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, cfg.ConnConfig.Host+":"+itoa(int(cfg.ConnConfig.Port)))
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(atoi(t, port))
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mw, _ := newMiddleware(t, idempotency.NewPostgresStore(pool), idempotency.Config{StoreTimeout: 500 * time.Millisecond})
	r := &runs{}
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return answer(req, r.note(ctx))
	}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{
		svc + "Closed": {},
		svc + "Open":   {Route: idempotency.RouteConfig{FailOpen: true}},
	}, h, "Closed", "Open"))
	if _, err := invoke(withKey(t.Context(), uuid.NewString()), cc, "Closed", request("a", codes.OK)); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	proxy.Cut()
	closed, open := uuid.NewString(), uuid.NewString()
	_, err = invoke(withKey(t.Context(), closed), cc, "Closed", request("a", codes.OK))
	wantAnswer(t, "fail-closed, store cut", err, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", time.Second)
	if r.count(closed) != 0 {
		t.Fatal("a fail-closed method ran with its store cut")
	}
	var hd metadata.MD
	if _, err := invoke(withKey(t.Context(), open), cc, "Open", request("a", codes.OK), grpc.Header(&hd)); err != nil || replayed(hd) || r.count(open) != 1 {
		t.Fatalf("fail-open, store cut: %v after %d runs; want a bypass", err, r.count(open))
	}
	proxy.Restore()
	if _, err := invoke(withKey(t.Context(), closed), cc, "Closed", request("a", codes.OK)); err != nil || r.count(closed) != 1 {
		t.Fatalf("after the cut: %v after %d runs; want the retry to execute", err, r.count(closed))
	}
}

// TestClientDeadline: a client whose deadline is shorter than the method
// gets DeadlineExceeded; the method runs on, detached, and the client's
// retry with the key gets its replay.
func TestClientDeadline(t *testing.T) {
	t.Parallel()
	recorded := make(chan struct{}, 1)
	mw, _ := newMiddleware(t, idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{
		Observer: func(_ context.Context, o idempotency.Observation) {
			if o.Outcome == idempotency.OutcomeExecuted {
				recorded <- struct{}{}
			}
		}})
	r := &runs{}
	release := make(chan struct{})
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		id := r.note(ctx)
		<-release
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return answer(req, id)
	}
	cc := dial(t, serve(t, mw, map[string]idemgrpc.Method{svc + "Slow": {}}, h, "Slow"))
	key := uuid.NewString()
	// The deadline leaves the request time to reach the handler on a
	// loaded machine; the handler outlasts it, since it waits for the
	// release that follows the client's DeadlineExceeded.
	ctx, cancel := context.WithTimeout(withKey(t.Context(), key), 2*time.Second)
	defer cancel()
	if _, err := invoke(ctx, cc, "Slow", request("a", codes.OK)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v; want DeadlineExceeded", err)
	}
	close(release)
	select { // an upper bound proving the wait never hangs, not a speed check
	case <-recorded:
	case <-time.After(30 * time.Second):
		t.Fatal("the detached method's answer was never recorded")
	}
	var hd metadata.MD
	resp, err := invoke(withKey(t.Context(), key), cc, "Slow", request("a", codes.OK), grpc.Header(&hd))
	if err != nil || !replayed(hd) || resp.GetServerId() != "1" || r.count(key) != 1 {
		t.Fatalf("retry: %v %v (%v) after %d runs; want the replay of the first run", resp, err, hd, r.count(key))
	}
}
