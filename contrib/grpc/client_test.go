package idemgrpc_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemgrpc "github.com/idemkit/idempotency/contrib/grpc"
	"github.com/idemkit/idempotency/internal/testdb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// fault is what the lossy proxy does to one call.
type fault int

const (
	pass        fault = iota
	dropRequest       // close the connection on the call's HEADERS frame: the server never sees it
	dropAnswer        // forward the whole request, then close on the server's first bytes: the answer is lost
)

// lossyProxy forwards HTTP/2 connections to target, reading the client's
// frames to apply the next fault to each new call (a HEADERS frame on a
// new stream).
type lossyProxy struct {
	target string
	ln     net.Listener
	mu     sync.Mutex
	faults []fault // the next calls' faults; pass when empty
	seen   map[fault]int
}

func newLossyProxy(t *testing.T, target string, faults ...fault) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{target: target, ln: ln, faults: faults, seen: map[fault]int{}}
	var wg sync.WaitGroup
	var conns sync.Map
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			wg.Go(func() { p.link(c); conns.Delete(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return p
}

// next is the fault of the next call.
func (p *lossyProxy) next() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := pass
	if len(p.faults) > 0 {
		f, p.faults = p.faults[0], p.faults[1:]
	}
	p.seen[f]++
	return f
}

// HTTP/2 frame types and flags the proxy reads.
const (
	frameData    = 0x0
	frameHeaders = 0x1
	flagEnd      = 0x1
)

// link forwards one connection, frame by frame from the client.
func (p *lossyProxy) link(c net.Conn) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer u.Close()
	var mu sync.Mutex
	mute := false
	go func() {
		defer c.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := u.Read(buf)
			mu.Lock()
			m := mute
			mu.Unlock()
			if m || err != nil {
				u.Close()
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	r := bufio.NewReader(c)
	preface := make([]byte, 24)
	if _, err := io.ReadFull(r, preface); err != nil {
		return
	}
	if _, err := u.Write(preface); err != nil {
		return
	}
	calls := map[uint32]fault{}
	for {
		frame := make([]byte, 9)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		n := int(frame[0])<<16 | int(frame[1])<<8 | int(frame[2])
		frame = append(frame, make([]byte, n)...)
		if _, err := io.ReadFull(r, frame[9:]); err != nil {
			return
		}
		typ, flags, stream := frame[3], frame[4], binary.BigEndian.Uint32(frame[5:9])&0x7fffffff
		if _, ok := calls[stream]; !ok && typ == frameHeaders && stream%2 == 1 {
			calls[stream] = p.next()
			if calls[stream] == dropRequest {
				return
			}
		}
		if _, err := u.Write(frame); err != nil {
			return
		}
		if (typ == frameData || typ == frameHeaders) && flags&flagEnd != 0 && calls[stream] == dropAnswer {
			mu.Lock()
			mute = true
			mu.Unlock()
		}
	}
}

// TestClientThroughLossyNetwork: through a proxy that drops calls before
// the server and answers after it, the client interceptor's retries keep
// one key per logical call: each call executes once, and its caller gets
// the first (only) execution's answer.
func TestClientThroughLossyNetwork(t *testing.T) {
	t.Parallel()
	mw, _ := newMiddleware(t, idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{})
	r := &runs{}
	h := func(ctx context.Context, _ string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return answer(req, keyOf(ctx)+"#"+itoa(r.count(keyOf(ctx)))+"/"+r.note(ctx))
	}
	addr := serve(t, mw, map[string]idemgrpc.Method{svc + "Transfer": {RequireKey: true}}, h, "Transfer")
	const calls = 12
	var faults []fault
	for i := range calls {
		faults = append(faults, []fault{dropAnswer, dropRequest, pass, dropAnswer, dropAnswer}[i%5])
	}
	proxy := newLossyProxy(t, addr, faults...)
	cc := dial(t, proxy.ln.Addr().String(), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 10})))
	for i := range calls {
		key := uuid.NewString()
		ctx, cancel := context.WithTimeout(idemgrpc.WithKey(t.Context(), key), 30*time.Second)
		var hd metadata.MD
		resp, err := invoke(ctx, cc, "Transfer", request("pay", codes.OK), grpc.Header(&hd))
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if r.count(key) != 1 || resp.GetServerId()[:len(key)+2] != key+"#0" {
			t.Fatalf("call %d: ran %d times, answered %q; want one run and its answer", i, r.count(key), resp.GetServerId())
		}
	}
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	if proxy.seen[dropAnswer] < 4 || proxy.seen[dropRequest] < 2 {
		t.Fatalf("faults applied: %v; the test did not lose enough", proxy.seen)
	}
	t.Logf("faults applied over %d logical calls: %v", calls, proxy.seen)
}

// TestClientRetriesOnlyInvited: the client interceptor retries Unavailable
// and Aborted IDEMPOTENCY_IN_FLIGHT with the same key, and returns every
// other answer (an Aborted of the handler's own among them) at once.
func TestClientRetriesOnlyInvited(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	keys := map[string][]string{}
	answers := map[string][]error{
		"Busy":    {answerErr(t, codes.Aborted, "IDEMPOTENCY_IN_FLIGHT"), answerErr(t, codes.Unavailable, "IDEMPOTENCY_STORE_UNAVAILABLE")},
		"Aborted": {status.Error(codes.Aborted, "the handler's own")},
		"Failed":  {answerErr(t, codes.FailedPrecondition, "IDEMPOTENCY_PREVIOUS_FAILED")},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(serviceDesc(func(ctx context.Context, method string, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		keys[method] = append(keys[method], keyOf(ctx))
		if as := answers[method[len(svc):]]; len(keys[method]) <= len(as) {
			return nil, as[len(keys[method])-1]
		}
		return answer(req, "ok")
	}, "Busy", "Aborted", "Failed"), nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cc := dial(t, ln.Addr().String(), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{})))
	if _, err := invoke(t.Context(), cc, "Busy", request("a", codes.OK)); err != nil {
		t.Fatalf("Busy: %v; want the third attempt's answer", err)
	}
	_, errA := invoke(t.Context(), cc, "Aborted", request("a", codes.OK))
	_, errF := invoke(t.Context(), cc, "Failed", request("a", codes.OK))
	mu.Lock()
	defer mu.Unlock()
	busy := keys[svc+"Busy"]
	if len(busy) != 3 || busy[0] == "" || busy[0] != busy[1] || busy[1] != busy[2] {
		t.Fatalf("Busy attempts' keys %q; want 3 attempts with one key", busy)
	}
	if status.Code(errA) != codes.Aborted || len(keys[svc+"Aborted"]) != 1 || status.Code(errF) != codes.FailedPrecondition || len(keys[svc+"Failed"]) != 1 {
		t.Fatalf("Aborted %v after %d attempts, Failed %v after %d; want each answered at once",
			errA, len(keys[svc+"Aborted"]), errF, len(keys[svc+"Failed"]))
	}
}

// answerErr is one of the contract's answers as the server interceptor
// sends it, with a short RetryInfo.
func answerErr(t *testing.T, code codes.Code, reason string) error {
	t.Helper()
	st, err := status.New(code, reason).WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: idemgrpc.Domain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}
