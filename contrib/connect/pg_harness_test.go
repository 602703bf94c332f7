package idemconnect_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/idemkit/idempotency/internal/childproc"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/structpb"
)

// The servers of the PostgreSQL tests speak HTTP/1.1 and HTTP/2 without
// TLS (h2c) on a loopback listener, so a child process needs no
// certificate; the clients speak HTTP/2 only, which the gRPC protocol
// needs and Connect and gRPC-Web accept.

// wire is one protocol, with the proto codec.
type wire struct {
	name string
	opts []connect.ClientOption
}

// wires are the three protocols.
var wires = []wire{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// allWires are the three protocols with the proto and the JSON codec.
var allWires = []wire{
	wires[0], wires[1], wires[2],
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc+json", []connect.ClientOption{connect.WithGRPC(), connect.WithProtoJSON()}},
	{"grpcweb+json", []connect.ClientOption{connect.WithGRPCWeb(), connect.WithProtoJSON()}},
}

// procFunc is one procedure of a test server.
type procFunc func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error)

// listenH2C serves h on a loopback port over HTTP/1.1 and h2c and returns
// its base URL and a function that stops it.
func listenH2C(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), ReadHeaderTimeout: 10 * time.Second}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// h2cClient is an HTTP/2-only client without TLS.
func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// serveProcs serves procs (by procedure name), those in methods through
// the interceptor over mw, and returns the base URL. A method that is not
// Scoped and sets no MinKeyLength takes keys of at least 16 bytes: the
// tests' keys are UUIDs.
func serveProcs(t testing.TB, mw *idempotency.Middleware, methods map[string]idemconnect.Method, procs map[string]procFunc) string {
	t.Helper()
	for name, m := range methods {
		if !m.Route.Scoped && m.Route.MinKeyLength == 0 {
			m.Route.MinKeyLength = 16
			methods[name] = m
		}
	}
	ic, err := idemconnect.NewInterceptor(mw, methods)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for name, f := range procs {
		mux.Handle(name, connect.NewUnaryHandler(name, f, connect.WithInterceptors(ic)))
	}
	url, stop, err := listenH2C(mux)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// stub is a client of procedure name at base over w.
type stub = *connect.Client[structpb.Struct, structpb.Struct]

func dialProc(hc *http.Client, base, name string, w wire) stub {
	return connect.NewClient[structpb.Struct, structpb.Struct](hc, base+name, w.opts...)
}

// pgMiddleware builds a middleware over pool with the kill-switch on.
func pgMiddleware(t testing.TB, pool *pgxpool.Pool, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	cfg.Enabled = func(context.Context) bool { return true }
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// reply is the test procedures' answer: the fields asked for, and run.
func reply(req *connect.Request[structpb.Struct], run string) *connect.Response[structpb.Struct] {
	out := &structpb.Struct{Fields: map[string]*structpb.Value{"run": structpb.NewStringValue(run)}}
	for k, v := range req.Msg.GetFields() {
		if k != "run" {
			out.Fields[k] = v
		}
	}
	return connect.NewResponse(out)
}

// asked is the error the request asks for in its "code" field, or nil.
func asked(req *connect.Request[structpb.Struct]) error {
	if code := req.Msg.GetFields()["code"].GetNumberValue(); code != 0 {
		return connect.NewError(connect.Code(code), errors.New("asked"))
	}
	return nil
}

// Environment of a child server process (serveChild).
const (
	envChildDSN   = "IDEMCONNECT_CHILD_DSN"   // the database the child serves from
	envChildBlock = "IDEMCONNECT_CHILD_BLOCK" // "1": Settle blocks after its write, until killed
)

// childDDL is what the child servers write: one row per execution.
const childDDL = `CREATE TABLE executions (key text NOT NULL, pid int NOT NULL);
CREATE TABLE ledger (key text NOT NULL)`

// serveChild serves Transfer (ordinary: records its execution, then
// answers) and Settle (transactional: writes its ledger row in the key's
// transaction) from dsn over h2c on a loopback port, printing "ADDR url",
// until its standard input closes. With block, Settle prints "STARTED key"
// after its write and never returns.
func serveChild(dsn string, block bool) {
	fail := func(err error) { fmt.Println("ERROR", err); os.Exit(1) }
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fail(err)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), idempotency.Config{Logger: quiet,
		Enabled: func(context.Context) bool { return true }})
	if err != nil {
		fail(err)
	}
	pid := fmt.Sprint(os.Getpid())
	ic, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{
		svc + "Transfer": {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16}}, // UUID keys
		svc + "Settle":   {RequireKey: true, Route: idempotency.RouteConfig{MinKeyLength: 16, Transactional: true}},
	})
	if err != nil {
		fail(err)
	}
	transfer := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		if _, err := pool.Exec(ctx, `INSERT INTO executions VALUES ($1, $2)`, req.Header().Get(idemconnect.KeyHeader), os.Getpid()); err != nil {
			return nil, err
		}
		return reply(req, pid), nil
	}
	settle := func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		key := req.Header().Get(idemconnect.KeyHeader)
		tx, _ := idempotency.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, key); err != nil {
			return nil, err
		}
		if block {
			fmt.Println("STARTED", key)
			select {}
		}
		return reply(req, pid), nil
	}
	mux := http.NewServeMux()
	mux.Handle(svc+"Transfer", connect.NewUnaryHandler(svc+"Transfer", transfer, connect.WithInterceptors(ic)))
	mux.Handle(svc+"Settle", connect.NewUnaryHandler(svc+"Settle", settle, connect.WithInterceptors(ic)))
	url, stop, err := listenH2C(mux)
	if err != nil {
		fail(err)
	}
	fmt.Println("ADDR", url)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // the parent closed stdin, or died
	stop()
	pool.Close()
}

// startChild starts a child server over dsn (serveChild in TestMain) and
// waits for its address.
func startChild(t *testing.T, dsn string, block bool) *childproc.Child {
	t.Helper()
	return childproc.Start(t, envChildDSN+"="+dsn, fmt.Sprintf("%s=%v", envChildBlock, map[bool]int{true: 1}[block]))
}
