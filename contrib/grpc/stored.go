package idemgrpc

// How a call's answer is stored and replayed, in idemrpc's format, shared
// with contrib/connect.

import (
	"context"
	"net/http"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// record is the handler's answer as the engine stores it (idemrpc.Record).
func record(resp any, herr error, c *captureStream, allow []string) idempotency.Response {
	st := status.Convert(herr)
	msg, _ := resp.(proto.Message)
	h := http.Header{}
	c.keep(h, allow)
	return idemrpc.Record(uint32(st.Code()), msg, st.Message(), st.Proto().GetDetails(), h)
}

// replay answers a stored response: its metadata, the replay marker, the
// key's expiry, and the message (of its type from the registry) or the
// status.
func replay(ctx context.Context, resp idempotency.Response, expires string) (any, error) {
	s, err := idemrpc.ReadStored(resp)
	if err != nil {
		return nil, status.Error(codes.Internal, "idemgrpc: "+err.Error())
	}
	header, trailer := metadata.Pairs(ReplayedKey, "true"), metadata.MD{}
	if expires != "" {
		header.Set(ExpiresKey, expires)
	}
	for k, vs := range s.Header {
		header.Append(k, vs...)
	}
	for k, vs := range s.Trailer {
		trailer.Append(k, vs...)
	}
	_ = grpc.SetHeader(ctx, header)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	if codes.Code(s.Code) != codes.OK {
		st := status.New(codes.Code(s.Code), s.Message).Proto()
		st.Details = s.Details
		return nil, status.ErrorProto(st)
	}
	msg, err := s.Response()
	if err != nil {
		return nil, status.Error(codes.Internal, "idemgrpc: "+err.Error())
	}
	return msg, nil
}

// errInfo is the ErrorInfo of one of the contract's answers.
func errInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md}
}
