package idemgrpc

// The contract's answers as gRPC statuses (idemrpc maps them, as it does
// for contrib/connect).

import (
	"errors"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every answer the interceptor gives
// instead of the handler's.
const Domain = idemrpc.Domain

// answerStatus is the gRPC status of an answer Exec gave instead of
// running the handler.
func answerStatus(err error) error {
	var ea *idempotency.ErrorAnswer
	if !errors.As(err, &ea) {
		return status.Error(codes.Internal, "idemgrpc: "+err.Error())
	}
	a := idemrpc.AnswerOf(ea)
	st := status.New(codes.Code(a.Code), a.Message)
	details := []protoadapt.MessageV1{protoadapt.MessageV1Of(errInfo(a.Reason, a.Metadata))}
	if a.RetryDelay > 0 {
		details = append(details, protoadapt.MessageV1Of(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.RetryDelay)}))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// Unsettled is the status a handler returns when its downstream outcome is
// unknown (a timeout, a dropped connection, a 5xx of a broker):
// Unavailable with an ErrorInfo of reason IDEMPOTENCY_UNSETTLED. Nothing
// is recorded; the caller gets Unavailable IDEMPOTENCY_STORE_UNAVAILABLE
// with a RetryInfo of 1s, and its retry reconciles the key (the method's
// Route.Reconcile), as idempotency.Unsettled does over HTTP.
func Unsettled(message string) error {
	st := status.New(codes.Unavailable, message)
	if withInfo, err := st.WithDetails(protoadapt.MessageV1Of(errInfo(idemrpc.ReasonUnsettled, nil))); err == nil {
		st = withInfo
	}
	return st.Err()
}
