package idemconnect

// The contract's answers as Connect errors, and a handler's code as the
// engine's outcome and stored HTTP status: the same as contrib/grpc's.

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every answer the interceptor gives
// instead of the handler's.
const Domain = "github.com/idemkit/idempotency"

// connectAnswers maps each of the contract's answers, by its
// idempotency_... code (the end of ErrorAnswer.Type), to its code; the
// ErrorInfo reason is that code in upper case, and retry answers carry a
// RetryInfo.
var connectAnswers = []struct {
	problem string
	code    connect.Code
	retry   bool
}{
	{"idempotency_in_flight", connect.CodeAborted, true},
	{"idempotency_key_body_mismatch", connect.CodeInvalidArgument, false},
	{"idempotency_key_required", connect.CodeInvalidArgument, false},
	{"idempotency_key_invalid", connect.CodeInvalidArgument, false},
	{"idempotency_scope_invalid", connect.CodeInvalidArgument, false},
	{"idempotency_previous_failed", connect.CodeFailedPrecondition, false},
	{"idempotency_outcome_unknown", connect.CodeFailedPrecondition, false},
	{"idempotency_response_not_stored", connect.CodeFailedPrecondition, false},
	{"idempotency_store_unavailable", connect.CodeUnavailable, true},
	{"idempotency_response_too_large", connect.CodeInternal, false},
}

// answerError is the Connect error of an answer Exec gave instead of
// running the handler.
func answerError(err error) error {
	var ea *idempotency.ErrorAnswer
	if !errors.As(err, &ea) {
		return connect.NewError(connect.CodeInternal, err)
	}
	code, reason, retry := connect.CodeInternal, "IDEMPOTENCY_INTERNAL", false
	for _, a := range connectAnswers {
		if strings.HasSuffix(ea.Type, a.problem) {
			code, reason, retry = a.code, strings.ToUpper(a.problem), a.retry
			break
		}
	}
	md := map[string]string{}
	delay := time.Duration(ea.RetryAfterMS) * time.Millisecond
	if retry && delay == 0 {
		delay = time.Second // as the HTTP answer's Retry-After: 1
	}
	if retry {
		md["retry_after_ms"] = strconv.FormatInt(delay.Milliseconds(), 10)
	}
	if ea.OriginalStatus != 0 {
		md["original_status"] = strconv.Itoa(ea.OriginalStatus)
	}
	ce := connect.NewError(code, errors.New(ea.Error())) // about a key, never the HTTP header
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: md}); err == nil {
		ce.AddDetail(d)
	}
	if retry {
		if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// httpStatus is code's HTTP status by gRPC's mapping (google/rpc/code.proto),
// the status response_code stores.
func httpStatus(code connect.Code) int {
	switch code {
	case 0:
		return 200
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return 400
	case connect.CodeDeadlineExceeded:
		return 504
	case connect.CodeNotFound:
		return 404
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return 409
	case connect.CodePermissionDenied:
		return 403
	case connect.CodeUnauthenticated:
		return 401
	case connect.CodeResourceExhausted:
		return 429
	case connect.CodeUnimplemented:
		return 501
	case connect.CodeUnavailable:
		return 503
	}
	return 500 // Unknown, Internal, DataLoss, and codes Connect does not define
}

// outcomeOf is the engine's outcome for a handler's code: OK and the
// deterministic codes complete (and replay), ResourceExhausted releases
// the key, every other code fails it.
func outcomeOf(code connect.Code) string {
	switch code {
	case 0, connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodePermissionDenied,
		connect.CodeFailedPrecondition, connect.CodeOutOfRange, connect.CodeUnauthenticated, connect.CodeUnimplemented:
		return "complete"
	case connect.CodeResourceExhausted:
		return "release"
	}
	return "fail"
}
