// Package idemrpc is what the gRPC and Connect adapters (contrib/grpc,
// contrib/connect) share, written once so a call hashes and answers alike
// on both: the request hash's input of a protobuf message, and the
// contract's answers and a handler's codes in RPC status codes (gRPC's
// numbering, which Connect shares).
package idemrpc

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Domain is the ErrorInfo domain of every answer an adapter gives instead
// of the handler's.
const Domain = "github.com/idemkit/idempotency"

// ExpiresKey is the header metadata key of the key's expiry (FormatExpires)
// on the handler's own answer and on a replay; an error answer of the
// contract carries it as its ErrorInfo metadata "expires_at".
const ExpiresKey = "idempotency-expires"

// FormatExpires is an expiry (idempotency.CallInfo.Expires) as the adapters
// send it: RFC 3339 in UTC with whole seconds (2006-01-02T15:04:05Z); "" for
// the zero time, when the call read or wrote no row.
func FormatExpires(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// RPC status codes, as gRPC and Connect number them.
const (
	codeOK                 = 0
	codeCanceled           = 1
	codeInvalidArgument    = 3
	codeDeadlineExceeded   = 4
	codeNotFound           = 5
	codeAlreadyExists      = 6
	codePermissionDenied   = 7
	codeResourceExhausted  = 8
	codeFailedPrecondition = 9
	codeAborted            = 10
	codeOutOfRange         = 11
	codeUnimplemented      = 12
	codeInternal           = 13
	codeUnavailable        = 14
	codeUnauthenticated    = 16
)

// RequestBytes is what the request hash covers besides the full method:
// the deterministic encoding of msg with unknown fields discarded at every
// level (a replica that does not know a field yet must hash alike), after
// a NUL byte, which no JSON text starts with, so the engine hashes it as
// raw bytes.
func RequestBytes(msg proto.Message) ([]byte, error) {
	if hasUnknown(msg.ProtoReflect()) {
		msg = proto.Clone(msg)
		discardUnknown(msg.ProtoReflect())
	}
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend([]byte{0}, msg)
}

// eachMessage calls f with every message set in m's fields, at one level.
func eachMessage(m protoreflect.Message, f func(protoreflect.Message) bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for l, i := v.List(), 0; i < l.Len(); i++ {
				if !f(l.Get(i).Message()) {
					return false
				}
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			ok := true
			v.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool { ok = f(v.Message()); return ok })
			return ok
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			return f(v.Message())
		}
		return true
	})
}

// hasUnknown reports whether m or a message inside it has unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	found := len(m.GetUnknown()) > 0
	if !found {
		eachMessage(m, func(m protoreflect.Message) bool { found = hasUnknown(m); return !found })
	}
	return found
}

// discardUnknown drops the unknown fields of m and every message inside it.
func discardUnknown(m protoreflect.Message) {
	if m.GetUnknown() != nil {
		m.SetUnknown(nil)
	}
	eachMessage(m, func(m protoreflect.Message) bool { discardUnknown(m); return true })
}

// Answer is one of the contract's answers as an RPC error: its code, the
// ErrorInfo reason and metadata (Domain), and a RetryInfo delay on the
// answers worth retrying.
type Answer struct {
	Code       uint32            // the RPC status code
	Message    string            // the status message: the answer's Error(), about a key, never the HTTP header
	Reason     string            // ErrorInfo.Reason: the answer's Kind, upper case
	Metadata   map[string]string // ErrorInfo.Metadata: retry_after_ms, original_status, expires_at
	RetryDelay time.Duration     // RetryInfo's delay; 0: no RetryInfo
}

// answers maps each of the contract's answers, by its Kind, to its
// code, and whether it is worth retrying.
var answers = map[string]struct {
	code  uint32
	retry bool
}{
	"idempotency_in_flight":           {codeAborted, true},
	"idempotency_key_body_mismatch":   {codeInvalidArgument, false},
	"idempotency_key_required":        {codeInvalidArgument, false},
	"idempotency_key_invalid":         {codeInvalidArgument, false},
	"idempotency_scope_invalid":       {codeInvalidArgument, false},
	"idempotency_previous_failed":     {codeFailedPrecondition, false},
	"idempotency_outcome_unknown":     {codeFailedPrecondition, false},
	"idempotency_key_expired":         {codeFailedPrecondition, false},
	"idempotency_response_not_stored": {codeFailedPrecondition, false},
	"idempotency_store_unavailable":   {codeUnavailable, true},
	"idempotency_response_too_large":  {codeInternal, false},
}

// ReasonLeaseLost is the ErrorInfo reason of a call whose Heartbeat lease
// was lost while its handler ran (idempotency.ErrLeaseLost): Unavailable,
// nothing recorded.
const ReasonLeaseLost = "IDEMPOTENCY_LEASE_LOST"

// AnswerOf is ea as an RPC error. An answer it does not know is Internal,
// IDEMPOTENCY_INTERNAL.
func AnswerOf(ea *idempotency.ErrorAnswer) Answer {
	a := Answer{Code: codeInternal, Message: ea.Error(), Reason: "IDEMPOTENCY_INTERNAL", Metadata: map[string]string{}}
	known, ok := answers[ea.Kind]
	if ok {
		a.Code, a.Reason = known.code, strings.ToUpper(ea.Kind)
	}
	if errors.Is(ea, idempotency.ErrLeaseLost) {
		// A Heartbeat call's lease was lost: Unavailable, as a store outage,
		// but its own reason, since the function ran.
		a.Reason = ReasonLeaseLost
	}
	if ok && known.retry {
		a.RetryDelay = time.Duration(ea.RetryAfterMS) * time.Millisecond
		if a.RetryDelay == 0 {
			a.RetryDelay = time.Second // as the HTTP answer's Retry-After: 1
		}
		a.Metadata["retry_after_ms"] = strconv.FormatInt(a.RetryDelay.Milliseconds(), 10)
	}
	if ea.OriginalStatus != 0 {
		a.Metadata["original_status"] = strconv.Itoa(ea.OriginalStatus)
	}
	if v := FormatExpires(ea.Expires); v != "" {
		a.Metadata["expires_at"] = v
	}
	return a
}

// HTTPStatus is code's HTTP status by gRPC's mapping
// (google/rpc/code.proto): the status response_code stores.
func HTTPStatus(code uint32) int {
	switch code {
	case codeOK:
		return 200
	case codeCanceled:
		return 499
	case codeInvalidArgument, codeFailedPrecondition, codeOutOfRange:
		return 400
	case codeDeadlineExceeded:
		return 504
	case codeNotFound:
		return 404
	case codeAlreadyExists, codeAborted:
		return 409
	case codePermissionDenied:
		return 403
	case codeUnauthenticated:
		return 401
	case codeResourceExhausted:
		return 429
	case codeUnimplemented:
		return 501
	case codeUnavailable:
		return 503
	}
	return 500 // Unknown, Internal, DataLoss, and codes gRPC does not define
}

// Outcome is the engine's outcome for a handler's code: OK and the
// deterministic codes complete (and replay), ResourceExhausted releases
// the key, every other code fails it.
func Outcome(code uint32) string {
	switch code {
	case codeOK, codeInvalidArgument, codeNotFound, codeAlreadyExists, codePermissionDenied,
		codeFailedPrecondition, codeOutOfRange, codeUnauthenticated, codeUnimplemented:
		return "complete"
	case codeResourceExhausted:
		return "release"
	}
	return "fail"
}
