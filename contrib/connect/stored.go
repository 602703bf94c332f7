package idemconnect

// How a call's answer is stored and replayed, in idemrpc's format, shared
// with contrib/grpc.

import (
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// record is the handler's answer as the engine stores it (idemrpc.Record).
func record(resp connect.AnyResponse, herr error, allow []string) idempotency.Response {
	code, msg, message := connect.Code(0), proto.Message(nil), ""
	var details []*anypb.Any
	h := http.Header{}
	if herr != nil {
		code, message = connect.CodeOf(herr), herr.Error()
		var ce *connect.Error
		if errors.As(herr, &ce) {
			message = ce.Message()
			for _, d := range ce.Details() {
				details = append(details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
			}
			keep(h, ce.Meta(), "", allow)
		}
	} else {
		msg, _ = resp.Any().(proto.Message)
		keep(h, resp.Header(), "", allow)
		keep(h, resp.Trailer(), idemrpc.TrailerPrefix, allow)
	}
	return idemrpc.Record(uint32(code), msg, message, details, h)
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

// advertise sets the key's expiry (ExpiresHeader) on the handler's own
// answer, its response's headers or its error's metadata, unless expires
// is "".
func advertise(out connect.AnyResponse, outErr error, expires string) {
	var ce *connect.Error
	switch {
	case expires == "":
	case outErr == nil && out != nil:
		out.Header().Set(ExpiresHeader, expires)
	case errors.As(outErr, &ce):
		ce.Meta().Set(ExpiresHeader, expires)
	}
}

// replay answers a stored response: its headers, the replay marker, the
// key's expiry, and the message or the error.
func replay(resp idempotency.Response, expires string) (connect.AnyResponse, error) {
	s, err := idemrpc.ReadStored(resp)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: "+err.Error()))
	}
	header, trailer := http.Header{}, http.Header{}
	for k, vs := range s.Header {
		header[http.CanonicalHeaderKey(k)] = vs
	}
	header.Set(ReplayedHeader, "true")
	if expires != "" {
		header.Set(ExpiresHeader, expires)
	}
	for k, vs := range s.Trailer {
		trailer[http.CanonicalHeaderKey(k)] = vs
	}
	if s.Code != 0 {
		ce := connect.NewError(connect.Code(s.Code), errors.New(s.Message))
		for _, a := range s.Details {
			if detail, err := connect.NewErrorDetail(a); err == nil {
				ce.AddDetail(detail)
			}
		}
		for k, vs := range header {
			ce.Meta()[k] = vs
		}
		return nil, ce
	}
	msg, err := s.Response()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: "+err.Error()))
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
