package idemgrpc

// How a call's request is hashed and its answer stored and replayed. The
// engine's columns are HTTP-shaped: response_code holds the code's HTTP
// status by gRPC's mapping, the body the response message's bytes, and the
// reserved header ":rpc" the code, the message's full name, the status
// message and each detail (a google.protobuf.Any, base64).

import (
	"context"
	"encoding/base64"
	"net/http"
	"strconv"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// Reserved header names of the stored response.
const (
	rpcHeader     = ":rpc"      // code, full name, message, details...
	outcomeHeader = ":outcome"  // the engine's: complete, fail or release
	trailerPrefix = ":trailer:" // an allow-listed trailer metadata key
)

// record is the handler's answer as the engine stores it.
func record(resp any, herr error, c *captureStream, allow []string) idempotency.Response {
	st := status.Convert(herr)
	code := st.Code()
	var name string
	body := []byte{}
	if code == codes.OK {
		msg, ok := resp.(proto.Message)
		var err error
		if ok {
			body, err = proto.Marshal(msg)
		}
		if !ok || err != nil {
			// Not storable: fail the key rather than replay something else.
			return idempotency.Response{Status: 500, Header: http.Header{outcomeHeader: {"fail"}}}
		}
		name = string(msg.ProtoReflect().Descriptor().FullName())
	}
	rpc := []string{strconv.Itoa(int(code)), name, st.Message()}
	for _, d := range st.Proto().GetDetails() {
		b, err := proto.Marshal(d)
		if err == nil {
			rpc = append(rpc, base64.StdEncoding.EncodeToString(b))
		}
	}
	h := http.Header{rpcHeader: rpc, outcomeHeader: {idemrpc.Outcome(uint32(code))}}
	c.keep(h, allow)
	return idempotency.Response{Status: idemrpc.HTTPStatus(uint32(code)), Header: h, Body: body, BodyKind: idempotency.BodyRaw}
}

// replay answers a stored response: its metadata, the replay marker, and
// the message (of its type from the registry) or the status.
func replay(ctx context.Context, resp idempotency.Response) (any, error) {
	rpc := resp.Header[rpcHeader]
	if len(rpc) < 3 {
		return nil, status.Error(codes.Internal, "idemgrpc: the stored response has no gRPC status")
	}
	header, trailer := metadata.Pairs(ReplayedKey, "true"), metadata.MD{}
	for k, vs := range resp.Header {
		switch {
		case len(k) > len(trailerPrefix) && k[:len(trailerPrefix)] == trailerPrefix:
			trailer.Append(k[len(trailerPrefix):], vs...)
		case k != "" && k[0] != ':':
			header.Append(k, vs...)
		}
	}
	_ = grpc.SetHeader(ctx, header)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	code, err := strconv.Atoi(rpc[0])
	if err != nil {
		return nil, status.Error(codes.Internal, "idemgrpc: the stored gRPC code does not parse")
	}
	if codes.Code(code) != codes.OK {
		return nil, storedStatus(codes.Code(code), rpc[2], rpc[3:])
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(rpc[1]))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the stored response's type %s is unknown to this server", rpc[1])
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(resp.Body, msg); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the stored %s does not decode: %v", rpc[1], err)
	}
	return msg, nil
}

// storedStatus rebuilds a recorded status with its details.
func storedStatus(code codes.Code, msg string, details []string) error {
	st := status.New(code, msg).Proto()
	for _, d := range details {
		b, err := base64.StdEncoding.DecodeString(d)
		a := new(anypb.Any)
		if err == nil && proto.Unmarshal(b, a) == nil {
			st.Details = append(st.Details, a)
		}
	}
	return status.ErrorProto(st)
}

// errInfo is the ErrorInfo of one of the contract's answers.
func errInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md}
}
