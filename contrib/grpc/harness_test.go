package idemgrpc_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// svc is the test service: each method takes a SimpleRequest and answers a
// SimpleResponse, registered by hand as generated code registers it.
const svc = "/idem.test.Payments/"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// handlerFunc is one method of the test service.
type handlerFunc func(ctx context.Context, method string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error)

// serviceDesc registers the methods named, all served by h.
func serviceDesc(h handlerFunc, methods ...string) *grpc.ServiceDesc {
	sd := &grpc.ServiceDesc{ServiceName: "idem.test.Payments", HandlerType: (*any)(nil)}
	for _, name := range methods {
		full := svc + name
		sd.Methods = append(sd.Methods, grpc.MethodDesc{MethodName: name,
			Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				in := new(testpb.SimpleRequest)
				if err := dec(in); err != nil {
					return nil, err
				}
				call := func(ctx context.Context, req any) (any, error) { return h(ctx, full, req.(*testpb.SimpleRequest)) }
				if ic == nil {
					return call(ctx, in)
				}
				return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, call)
			}})
	}
	return sd
}

// serve starts a gRPC server on a loopback port with the interceptor of
// methods over mw and returns its address. A method that is not Scoped
// and sets no MinKeyLength takes keys of at least 16 bytes: the tests'
// keys are UUIDs.
func serve(t testing.TB, mw *idempotency.Middleware, methods map[string]idemgrpc.Method, h handlerFunc, names ...string) string {
	t.Helper()
	for name, m := range methods {
		if !m.Route.Scoped && m.Route.MinKeyLength == 0 {
			m.Route.MinKeyLength = 16
			methods[name] = m
		}
	}
	ic, err := idemgrpc.UnaryServerInterceptor(mw, methods)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic))
	srv.RegisterService(serviceDesc(h, names...), nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dial connects to addr, with opts.
func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// newMiddleware builds a middleware over store with the kill-switch on.
func newMiddleware(t testing.TB, store idempotency.Store, cfg idempotency.Config) (*idempotency.Middleware, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, quiet
	if cfg.Enabled == nil {
		cfg.Enabled = func(context.Context) bool { return true }
	}
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw, reg
}

// runs counts executions by key and hands out execution ids.
type runs struct {
	mu sync.Mutex
	n  map[string]int
	id atomic.Int64
}

// note counts one execution of the call in ctx and returns its id.
func (r *runs) note(ctx context.Context) string {
	key := keyOf(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[key]++
	return strconv.FormatInt(r.id.Add(1), 10)
}

// count is how often key's call ran.
func (r *runs) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

// keyOf is the key the call in ctx was sent with.
func keyOf(ctx context.Context) string {
	if vs := metadata.ValueFromIncomingContext(ctx, idemgrpc.MetadataKey); len(vs) == 1 {
		return vs[0]
	}
	return ""
}

// withKey sends key as the call's idempotency key.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
}

// request asks the test service to answer body, or the code given.
func request(body string, code codes.Code) *testpb.SimpleRequest {
	r := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}
	if code != codes.OK {
		r.ResponseStatus = &testpb.EchoStatus{Code: int32(code), Message: "asked for " + code.String()}
	}
	return r
}

// answer is the test service's answer: the code asked for (with an
// ErrorInfo of the service's own), or the body with the execution id.
func answer(req *testpb.SimpleRequest, id string) (*testpb.SimpleResponse, error) {
	if st := req.GetResponseStatus(); st != nil {
		s, _ := status.New(codes.Code(st.GetCode()), st.GetMessage()).WithDetails(&errdetails.ErrorInfo{Reason: "ASKED", Domain: "test"})
		return nil, s.Err()
	}
	return &testpb.SimpleResponse{Payload: req.GetPayload(), ServerId: id}, nil
}

// invoke calls method on cc.
func invoke(ctx context.Context, cc *grpc.ClientConn, method string, req *testpb.SimpleRequest, opts ...grpc.CallOption) (*testpb.SimpleResponse, error) {
	out := new(testpb.SimpleResponse)
	err := cc.Invoke(ctx, svc+method, req, out, opts...)
	return out, err
}

// wantAnswer checks that err is the contract's answer: code, ErrorInfo
// reason in the library's domain, and a RetryInfo exactly when retry > 0.
func wantAnswer(t testing.TB, what string, err error, code codes.Code, reason string, retry time.Duration) *errdetails.ErrorInfo {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("%s: %v; want code %v", what, err, code)
	}
	var info *errdetails.ErrorInfo
	var delay time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	if info == nil || info.GetReason() != reason || info.GetDomain() != idemgrpc.Domain {
		t.Fatalf("%s: ErrorInfo %v; want reason %s in domain %s", what, info, reason, idemgrpc.Domain)
	}
	if delay != retry {
		t.Fatalf("%s: RetryInfo delay %v, want %v", what, delay, retry)
	}
	if retry > 0 && info.GetMetadata()["retry_after_ms"] != strconv.FormatInt(retry.Milliseconds(), 10) {
		t.Fatalf("%s: ErrorInfo metadata %v; want retry_after_ms", what, info.GetMetadata())
	}
	return info
}

// replayed reports whether header marks a replay.
func replayed(header metadata.MD) bool {
	return strings.Join(header.Get(idemgrpc.ReplayedKey), ",") == "true"
}

func itoa(n int) string { return strconv.Itoa(n) }

func atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
