package idemconnect

// How a call's answer is stored and replayed: response_code holds the
// code's HTTP status by gRPC's mapping, the body the response message's
// bytes, and the reserved header ":rpc" the code, the message's full name,
// the error message and each detail (a google.protobuf.Any, base64), as
// contrib/grpc stores them.

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// Reserved header names of the stored response.
const (
	rpcHeader     = ":rpc"      // code, full name, message, details...
	outcomeHeader = ":outcome"  // the engine's: complete, fail or release
	trailerPrefix = ":trailer:" // an allow-listed trailer
)

// record is the handler's answer as the engine stores it.
func record(resp connect.AnyResponse, herr error, allow []string) idempotency.Response {
	code, name, body := connect.Code(0), "", []byte{}
	var msg string
	var details []*connect.ErrorDetail
	h := http.Header{}
	if herr != nil {
		code = connect.CodeOf(herr)
		msg = herr.Error()
		var ce *connect.Error
		if errors.As(herr, &ce) {
			msg, details = ce.Message(), ce.Details()
			keep(h, ce.Meta(), "", allow)
		}
	} else {
		m, ok := resp.Any().(proto.Message)
		var err error
		if ok {
			body, err = proto.Marshal(m)
		}
		if !ok || err != nil {
			return idempotency.Response{Status: 500, Header: http.Header{outcomeHeader: {"fail"}}}
		}
		name = string(m.ProtoReflect().Descriptor().FullName())
		keep(h, resp.Header(), "", allow)
		keep(h, resp.Trailer(), trailerPrefix, allow)
	}
	rpc := []string{strconv.Itoa(int(code)), name, msg}
	for _, d := range details {
		b, err := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		if err == nil {
			rpc = append(rpc, base64.StdEncoding.EncodeToString(b))
		}
	}
	h[rpcHeader], h[outcomeHeader] = rpc, []string{idemrpc.Outcome(uint32(code))}
	return idempotency.Response{Status: idemrpc.HTTPStatus(uint32(code)), Header: h, Body: body, BodyKind: idempotency.BodyRaw}
}

// keep copies the allow-listed headers of from into h, under prefix.
func keep(h, from http.Header, prefix string, allow []string) {
	for _, k := range allow {
		if vs := from.Values(k); len(vs) > 0 {
			h[prefix+k] = append([]string(nil), vs...)
		}
	}
}

// replayed is a replayed response message: a message of the stored type
// from the registry. connect-go sends Response.Any() without checking it
// against the handler's type, so the wrapper stands in for it.
type replayed struct{ proto.Message }

// replay answers a stored response: its headers, the replay marker, and the
// message or the error.
func replay(resp idempotency.Response) (connect.AnyResponse, error) {
	rpc := resp.Header[rpcHeader]
	if len(rpc) < 3 {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: the stored response has no status"))
	}
	header, trailer := http.Header{}, http.Header{}
	header.Set(ReplayedHeader, "true")
	for k, vs := range resp.Header {
		switch {
		case strings.HasPrefix(k, trailerPrefix):
			trailer[http.CanonicalHeaderKey(k[len(trailerPrefix):])] = vs
		case k != "" && k[0] != ':':
			header[http.CanonicalHeaderKey(k)] = vs
		}
	}
	code, err := strconv.Atoi(rpc[0])
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: the stored code does not parse"))
	}
	if code != 0 {
		ce := connect.NewError(connect.Code(code), errors.New(rpc[2]))
		for _, d := range rpc[3:] {
			b, err := base64.StdEncoding.DecodeString(d)
			a := new(anypb.Any)
			if err == nil && proto.Unmarshal(b, a) == nil {
				if detail, err := connect.NewErrorDetail(a); err == nil {
					ce.AddDetail(detail)
				}
			}
		}
		for k, vs := range header {
			ce.Meta()[k] = vs
		}
		return nil, ce
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(rpc[1]))
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: the stored response's type "+rpc[1]+" is unknown to this server"))
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(resp.Body, msg); err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: the stored "+rpc[1]+" does not decode"))
	}
	out := connect.NewResponse(&replayed{msg})
	for k, vs := range header {
		out.Header()[k] = vs
	}
	for k, vs := range trailer {
		out.Trailer()[k] = vs
	}
	return out, nil
}
