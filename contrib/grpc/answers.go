package idemgrpc

// The contract's answers as gRPC statuses, and a handler's code as the
// engine's outcome and stored HTTP status.

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every answer the interceptor gives
// instead of the handler's.
const Domain = "github.com/idemkit/idempotency"

// grpcAnswers maps each of the contract's answers, by its idempotency_...
// code (the end of ErrorAnswer.Type), to its code; the ErrorInfo reason is
// that code in upper case, and retry answers carry a RetryInfo.
var grpcAnswers = []struct {
	problem string
	code    codes.Code
	retry   bool
}{
	{"idempotency_in_flight", codes.Aborted, true},
	{"idempotency_key_body_mismatch", codes.InvalidArgument, false},
	{"idempotency_key_required", codes.InvalidArgument, false},
	{"idempotency_key_invalid", codes.InvalidArgument, false},
	{"idempotency_scope_invalid", codes.InvalidArgument, false},
	{"idempotency_previous_failed", codes.FailedPrecondition, false},
	{"idempotency_outcome_unknown", codes.FailedPrecondition, false},
	{"idempotency_response_not_stored", codes.FailedPrecondition, false},
	{"idempotency_store_unavailable", codes.Unavailable, true},
	{"idempotency_response_too_large", codes.Internal, false},
}

// answerStatus is the gRPC status of an answer Exec gave instead of
// running the handler.
func answerStatus(err error) error {
	var ea *idempotency.ErrorAnswer
	if !errors.As(err, &ea) {
		return status.Error(codes.Internal, "idemgrpc: "+err.Error())
	}
	code, reason, retry := codes.Internal, "IDEMPOTENCY_INTERNAL", false
	for _, a := range grpcAnswers {
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
	st := status.New(code, ea.Error()) // about a key, never the HTTP header
	details := []protoadapt.MessageV1{protoadapt.MessageV1Of(errInfo(reason, md))}
	if retry {
		details = append(details, protoadapt.MessageV1Of(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// httpStatus is code's HTTP status by gRPC's mapping (google/rpc/code.proto),
// the status response_code stores.
func httpStatus(code codes.Code) int {
	switch code {
	case codes.OK:
		return 200
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.DeadlineExceeded:
		return 504
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.Unauthenticated:
		return 401
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	}
	return 500 // Unknown, Internal, DataLoss, and codes gRPC does not define
}

// outcomeOf is the engine's outcome for a handler's code: OK and the
// deterministic codes complete (and replay), ResourceExhausted releases
// the key, every other code fails it.
func outcomeOf(code codes.Code) string {
	switch code {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated, codes.Unimplemented:
		return "complete"
	case codes.ResourceExhausted:
		return "release"
	}
	return "fail"
}
