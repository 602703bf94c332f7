package idemrpc

// How a call's answer is stored and read back, alike for gRPC and Connect.
// The engine's columns are HTTP-shaped: response_code holds the code's
// HTTP status by gRPC's mapping, the body the response message's bytes,
// and the reserved header ":rpc" the code, the message's full name, the
// status message and each detail (a google.protobuf.Any, base64).

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// Reserved header names of a stored answer; every other stored header is
// an allow-listed response header.
const (
	rpcHeader     = ":rpc"     // code, full name, message, details...
	outcomeHeader = ":outcome" // the engine's: complete, fail or release
	// TrailerPrefix prefixes an allow-listed trailer's name among a stored
	// answer's headers.
	TrailerPrefix = ":trailer:"
)

// Record is a handler's answer as the engine stores it: Unavailable with
// an ErrorInfo of reason ReasonUnsettled ends the call Unsettled (nothing
// stored, the retry reconciles); any other code, and msg
// when code is OK (a message that does not marshal fails the key rather
// than replay something else), or the status message and details; h holds
// the allow-listed headers and trailers (TrailerPrefix) and is kept (nil:
// none).
func Record(code uint32, msg proto.Message, message string, details []*anypb.Any, h http.Header) idempotency.Response {
	if h == nil {
		h = http.Header{}
	}
	if code == codeUnavailable && unsettled(details) {
		return idempotency.Response{Status: HTTPStatus(code), Header: http.Header{outcomeHeader: {"unsettled"}}}
	}
	body, name := []byte{}, ""
	if code == codeOK {
		var err error
		if msg != nil {
			body, err = proto.Marshal(msg)
		}
		if msg == nil || err != nil {
			return idempotency.Response{Status: 500, Header: http.Header{outcomeHeader: {"fail"}}}
		}
		name = string(msg.ProtoReflect().Descriptor().FullName())
	}
	rpc := []string{strconv.FormatUint(uint64(code), 10), name, message}
	for _, d := range details {
		if b, err := proto.Marshal(d); err == nil {
			rpc = append(rpc, base64.StdEncoding.EncodeToString(b))
		}
	}
	h[rpcHeader], h[outcomeHeader] = rpc, []string{Outcome(code)}
	return idempotency.Response{Status: HTTPStatus(code), Header: h, Body: body, BodyKind: idempotency.BodyRaw}
}

// Stored is an answer Record stored, read back for a replay.
type Stored struct {
	Code    uint32       // the gRPC status code the call answered
	Message string       // the status message, when Code is not OK
	Details []*anypb.Any // the status details that decode
	Header  http.Header  // the stored response headers
	Trailer http.Header  // the stored trailers
	name    string
	body    []byte
}

// ReadStored reads resp back; its errors say what of it is unusable.
func ReadStored(resp idempotency.Response) (Stored, error) {
	rpc := resp.Header[rpcHeader]
	if len(rpc) < 3 {
		return Stored{}, errors.New("the stored response has no status")
	}
	code, err := strconv.ParseUint(rpc[0], 10, 32)
	if err != nil {
		return Stored{}, errors.New("the stored code does not parse")
	}
	s := Stored{Code: uint32(code), Message: rpc[2], Header: http.Header{}, Trailer: http.Header{}, name: rpc[1], body: resp.Body}
	for k, vs := range resp.Header {
		switch {
		case strings.HasPrefix(k, TrailerPrefix):
			s.Trailer[k[len(TrailerPrefix):]] = vs
		case k != "" && k[0] != ':':
			s.Header[k] = vs
		}
	}
	for _, d := range rpc[3:] {
		b, err := base64.StdEncoding.DecodeString(d)
		a := new(anypb.Any)
		if err == nil && proto.Unmarshal(b, a) == nil {
			s.Details = append(s.Details, a)
		}
	}
	return s, nil
}

// Response decodes the stored response message, of its type from the
// global registry.
func (s Stored) Response() (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(s.name))
	if err != nil {
		return nil, fmt.Errorf("the stored response's type %s is unknown to this server", s.name)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(s.body, msg); err != nil {
		return nil, fmt.Errorf("the stored %s does not decode: %v", s.name, err)
	}
	return msg, nil
}

// ReasonUnsettled is the ErrorInfo reason of a handler's Unavailable
// status that says its downstream outcome is unknown, as
// idempotency.Unsettled says it over HTTP.
const ReasonUnsettled = "IDEMPOTENCY_UNSETTLED"

// errorInfoURL is the type URL of a google.rpc.ErrorInfo detail.
const errorInfoURL = "type.googleapis.com/google.rpc.ErrorInfo"

// unsettled reports an ErrorInfo detail of reason ReasonUnsettled, read
// from its wire form (reason is field 1).
func unsettled(details []*anypb.Any) bool {
	for _, d := range details {
		if d.GetTypeUrl() != errorInfoURL {
			continue
		}
		for b := d.GetValue(); len(b) > 0; {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				break
			}
			b = b[n:]
			if num == 1 && typ == protowire.BytesType {
				v, m := protowire.ConsumeBytes(b)
				if m >= 0 && string(v) == ReasonUnsettled {
					return true
				}
			}
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				break
			}
			b = b[n:]
		}
	}
	return false
}
