package idemgrpc_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/childproc"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// Environment of a child server process (serveChild).
const (
	envChildDSN   = "IDEMGRPC_CHILD_DSN"   // the database the child serves from
	envChildBlock = "IDEMGRPC_CHILD_BLOCK" // "1": Settle blocks after its write, until killed
)

// TestMain runs a child server when the test binary is started as one, and
// otherwise the tests, stopping the Postgres container testdb may start.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(envChildDSN); dsn != "" {
		serveChild(dsn, os.Getenv(envChildBlock) == "1")
		return
	}
	os.Exit(testdb.Main(m).Run())
}

// childDDL is what the child servers write: one row per execution.
const childDDL = `CREATE TABLE executions (key text NOT NULL, pid int NOT NULL);
CREATE TABLE ledger (key text NOT NULL)`

// serveChild serves Transfer (ordinary: records its execution, then
// answers) and Settle (transactional: writes its ledger row in the key's
// transaction) from dsn on a loopback port, printing "ADDR host:port",
// until its standard input closes. With block, Settle prints "STARTED key"
// after its write and never returns.
func serveChild(dsn string, block bool) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{Logger: quiet,
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	h := func(ctx context.Context, method string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		key := keyOf(ctx)
		if method == svc+"Settle" {
			tx, _ := idempotency.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, key); err != nil {
				return nil, err
			}
			if block {
				fmt.Println("STARTED", key)
				select {}
			}
			return answer(req, fmt.Sprint(os.Getpid()))
		}
		if _, err := pool.Exec(ctx, `INSERT INTO executions VALUES ($1, $2)`, key, os.Getpid()); err != nil {
			return nil, err
		}
		return answer(req, fmt.Sprint(os.Getpid()))
	}
	ic, err := idemgrpc.UnaryServerInterceptor(mw, map[string]idemgrpc.Method{
		svc + "Transfer": {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16}}, // UUID keys
		svc + "Settle":   {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16, Transactional: true}},
	})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic))
	srv.RegisterService(serviceDesc(h, "Transfer", "Settle"), nil)
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("ADDR", ln.Addr().String())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // the parent closed stdin, or died
	srv.Stop()
	pool.Close()
}

// startChild starts a child server over dsn (serveChild in TestMain) and
// waits for its address.
func startChild(t *testing.T, dsn string, block bool) *childproc.Child {
	t.Helper()
	return childproc.Start(t, envChildDSN+"="+dsn, fmt.Sprintf("%s=%v", envChildBlock, map[bool]int{true: 1}[block]))
}
