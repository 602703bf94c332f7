package idemconnect_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

const svc = "/idem.test.Payments/"

// uuidKeys is the policy of the tests' unscoped procedures: their keys are
// UUIDs.
var uuidKeys = idempotency.RouteConfig{MinKeyLength: 16}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testServer serves the test procedures over HTTP/2 with TLS, so the gRPC
// protocol works beside Connect and gRPC-Web.
type testServer struct {
	srv     *httptest.Server
	mu      sync.Mutex
	runs    map[string]int
	started chan struct{}
	release chan struct{}
}

// newServer builds the interceptor over store and serves Transfer
// (optional key), Settle (key required) and Slow (blocks until release).
// Each answers the request's "code" field as an error (with an ErrorInfo
// of its own), or the request with the run's number.
func newServer(t testing.TB, store idempotency.Store, cfg idempotency.Config) *testServer {
	t.Helper()
	cfg.Registerer, cfg.Logger = prometheus.NewRegistry(), quiet
	cfg.Enabled = func(context.Context) bool { return true }
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{
		svc + "Transfer": {ReplayHeaders: []string{"X-Receipt"}, Route: uuidKeys},
		svc + "Settle":   {RequireKey: true, Route: uuidKeys},
		svc + "Slow":     {Route: uuidKeys},
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{runs: map[string]int{}, started: make(chan struct{}, 1), release: make(chan struct{})}
	mux := http.NewServeMux()
	for _, name := range []string{"Transfer", "Settle", "Slow"} {
		mux.Handle(svc+name, connect.NewUnaryHandler(svc+name, func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
			return ts.handle(name, req)
		}, connect.WithInterceptors(ic)))
	}
	ts.srv = httptest.NewUnstartedServer(mux)
	ts.srv.EnableHTTP2 = true
	ts.srv.StartTLS()
	t.Cleanup(ts.srv.Close)
	return ts
}

func (ts *testServer) handle(name string, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	key := req.Header().Get(idemconnect.KeyHeader)
	ts.mu.Lock()
	ts.runs[key]++
	n := ts.runs[key]
	ts.mu.Unlock()
	if name == "Slow" {
		ts.started <- struct{}{}
		<-ts.release
	}
	if code := req.Msg.GetFields()["code"].GetNumberValue(); code != 0 {
		ce := connect.NewError(connect.Code(code), errors.New("asked"))
		d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "ASKED", Domain: "test"})
		ce.AddDetail(d)
		return nil, ce
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	proto.Merge(out, req.Msg)
	out.Fields["run"] = structpb.NewNumberValue(float64(n))
	resp := connect.NewResponse(out)
	resp.Header().Set("X-Receipt", "r-"+strconv.Itoa(n))
	resp.Header().Set("X-Secret", "s")
	return resp, nil
}

func (ts *testServer) count(key string) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.runs[key]
}

// protocols are the client options of each protocol and codec.
var protocols = map[string][]connect.ClientOption{
	"connect+proto": nil,
	"connect+json":  {connect.WithProtoJSON()},
	"grpc+proto":    {connect.WithGRPC()},
	"grpc+json":     {connect.WithGRPC(), connect.WithProtoJSON()},
	"grpcweb+proto": {connect.WithGRPCWeb()},
	"grpcweb+json":  {connect.WithGRPCWeb(), connect.WithProtoJSON()},
}

// client calls procedure name of ts with opts.
func (ts *testServer) client(name string, opts []connect.ClientOption) *connect.Client[structpb.Struct, structpb.Struct] {
	return connect.NewClient[structpb.Struct, structpb.Struct](ts.srv.Client(), ts.srv.URL+svc+name, opts...)
}

// call sends fields with key ("" for none).
func call(ctx context.Context, c *connect.Client[structpb.Struct, structpb.Struct], key string, fields map[string]any) (*connect.Response[structpb.Struct], error) {
	msg, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, err
	}
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set(idemconnect.KeyHeader, key)
	}
	return c.CallUnary(ctx, req)
}

// TestProtocols: over Connect, gRPC and gRPC-Web, with the proto and JSON
// codecs, a retry gets the first answer (message or error, with its
// details) and Idempotent-Replayed: true; the method ran once.
func TestProtocols(t *testing.T) {
	t.Parallel()
	ts := newServer(t, idempotency.NewMemoryStore(), idempotency.Config{})
	for name, opts := range protocols {
		t.Run(name, func(t *testing.T) {
			c := ts.client("Transfer", opts)
			key := uuid.NewString()
			first, err := call(t.Context(), c, key, map[string]any{"amount": 10, "to": "acct-7"})
			if err != nil || first.Header().Get(idemconnect.ReplayedHeader) != "" {
				t.Fatalf("first: %v %v", first, err)
			}
			again, err := call(t.Context(), c, key, map[string]any{"amount": 10, "to": "acct-7"})
			if err != nil || !proto.Equal(first.Msg, again.Msg) || again.Header().Get(idemconnect.ReplayedHeader) != "true" ||
				again.Header().Get("X-Receipt") != first.Header().Get("X-Receipt") || again.Header().Get("X-Secret") != "" || ts.count(key) != 1 {
				t.Fatalf("retry: %v %v (header %v) after %d runs; want the replay of %v", again.Msg, err, again.Header(), ts.count(key), first.Msg)
			}
			failed := uuid.NewString()
			_, errFirst := call(t.Context(), c, failed, map[string]any{"code": float64(connect.CodeNotFound)})
			_, errAgain := call(t.Context(), c, failed, map[string]any{"code": float64(connect.CodeNotFound)})
			var ce *connect.Error
			if !errors.As(errAgain, &ce) || ce.Code() != connect.CodeNotFound || ce.Message() != "asked" ||
				ce.Meta().Get(idemconnect.ReplayedHeader) != "true" || len(ce.Details()) != 1 || ts.count(failed) != 1 {
				t.Fatalf("error retry: %v after %d runs; want the replay of %v", errAgain, ts.count(failed), errFirst)
			}
			if v, err := ce.Details()[0].Value(); err != nil || v.(*errdetails.ErrorInfo).GetReason() != "ASKED" {
				t.Fatalf("replayed detail %v %v", v, err)
			}
		})
	}
}

// wantAnswer checks that err is the contract's answer: code, ErrorInfo
// reason in the library's domain, and a RetryInfo exactly when retry > 0.
func wantAnswer(t testing.TB, what string, err error, code connect.Code, reason string, retry time.Duration) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code {
		t.Fatalf("%s: %v; want code %v", what, err, code)
	}
	var info *errdetails.ErrorInfo
	var delay time.Duration
	for _, d := range ce.Details() {
		switch v, _ := d.Value(); v := v.(type) {
		case *errdetails.ErrorInfo:
			info = v
		case *errdetails.RetryInfo:
			delay = v.GetRetryDelay().AsDuration()
		}
	}
	if info == nil || info.GetReason() != reason || info.GetDomain() != idemconnect.Domain || delay != retry {
		t.Fatalf("%s: ErrorInfo %v, RetryInfo %v; want reason %s in %s, retry %v", what, info, delay, reason, idemconnect.Domain, retry)
	}
}

// TestAnswers: the contract's answers, by code, ErrorInfo and RetryInfo,
// over each protocol.
func TestAnswers(t *testing.T) {
	t.Parallel()
	ts := newServer(t, idempotency.NewMemoryStore(), idempotency.Config{})
	for name, opts := range protocols {
		ctx := t.Context()
		slow, transfer, settle := ts.client("Slow", opts), ts.client("Transfer", opts), ts.client("Settle", opts)
		key := uuid.NewString()
		done := make(chan error, 1)
		go func() { _, err := call(ctx, slow, key, map[string]any{"a": 1}); done <- err }()
		<-ts.started
		_, err := call(ctx, slow, key, map[string]any{"a": 1})
		wantAnswer(t, name+": in flight", err, connect.CodeAborted, "IDEMPOTENCY_IN_FLIGHT", 5*time.Second)
		ts.release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_, err = call(ctx, slow, key, map[string]any{"a": 2})
		wantAnswer(t, name+": mismatch", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_BODY_MISMATCH", 0)
		_, err = call(ctx, settle, "", map[string]any{"a": 1})
		wantAnswer(t, name+": no key, required", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_REQUIRED", 0)
		if ce := new(connect.Error); !errors.As(err, &ce) || strings.Contains(ce.Message(), "header") || !strings.Contains(ce.Message(), "idempotency key") {
			t.Fatalf("no key: %v, want a message about the idempotency key, not a header", err)
		}
		_, err = call(ctx, transfer, strings.Repeat("k", 256), map[string]any{"a": 1})
		wantAnswer(t, name+": a 256-byte key", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0)
		failed := uuid.NewString()
		_, _ = call(ctx, transfer, failed, map[string]any{"code": float64(connect.CodeInternal)})
		_, err = call(ctx, transfer, failed, map[string]any{"code": float64(connect.CodeInternal)})
		wantAnswer(t, name+": previous failed", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED", 0)
	}
}

// connectRequest is msg sent with key.
func connectRequest(msg *structpb.Struct, key string) *connect.Request[structpb.Struct] {
	req := connect.NewRequest(msg)
	req.Header().Set(idemconnect.KeyHeader, key)
	return req
}
